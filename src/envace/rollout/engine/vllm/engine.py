""":class:`VLLMEngine`: the rollout's generations sampled by a vLLM server, tokens in and tokens out.

Every request sends its prompt as token ids and gets the sampled ids and their log-probs back (no
detokenise/retokenise round trip), with the episode's stop ids, budget and a seed drawn from the
episode's own random stream. A group's requests go out together; the server batches them
(continuous batching, prefix caching) and as each one returns, its episode's course is resumed and
its next request sent (the same :class:`~envace.rollout.engine.Engine` contract as
:class:`~envace.rollout.engine.GenerationEngine`).

The engine follows the trained weights itself: before it samples, it compares their version
counters with those it last sent (:mod:`.weights`) and, when they moved, loads them into the server
under a new name; every answer must come from that name (:func:`~.http.completion_sample`).
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from envace import hardware
from envace.paths import cache_dir
from envace.rollout.engine.sampling import Decoding, EngineStats, Follow, Request, Sample, SamplingConfig
from envace.rollout.engine.vllm.http import VLLMError, call, completion_sample
from envace.rollout.engine.vllm.server import BASE_NAME, Launch, VLLMServer, shared_server, vllm_python
from envace.rollout.engine.vllm.weights import is_lora, lora_rank, signature, write_adapter, write_base, write_full

#: seeds vLLM takes (a request's seed is drawn from its episode's stream)
SEED_RANGE = 2**31 - 1


@dataclass
class Served:
    """What the server samples for this engine: the model ``name`` requests ask for, loaded from the
    weights whose version counters were ``signature``."""

    name: str
    signature: tuple[float, ...]
    folder: Path | None = None


@dataclass
class SyncStats:
    """Weight syncs and their cost (writing the files and loading them into the server)."""

    syncs: int = 0
    seconds: float = 0.0


@dataclass
class VLLMEngine(Decoding):
    """Samples continuations of token prompts on a vLLM server.

    Args:
        model: the policy in memory (a peft model: adapters sync; a plain model: all weights reload).
        stop_ids: ids that end a turn.
        pad_id: the padding id (the rollout's batches use it; the server never sees padding).
        sampling: the sampling configuration (``sampling.vllm``: the server).
        server: the server (:meth:`create` starts or attaches one).
    """

    model: Any
    stop_ids: list[int]
    pad_id: int
    sampling: SamplingConfig
    server: VLLMServer
    stats: EngineStats = field(default_factory=EngineStats)
    sync: SyncStats = field(default_factory=SyncStats)
    served: Served | None = None
    prefix: str = "policy"
    scratch: Path | None = None
    instant: ClassVar[bool] = False

    @classmethod
    def create(
        cls, model: Any, tokenizer: Any, stop_ids: list[int], pad_id: int, sampling: SamplingConfig
    ) -> VLLMEngine:
        """An engine over ``model``: on the server at ``sampling.vllm.url``, or on one launched for the
        model's base weights (shared by the engines of models with the same frozen base)."""
        config = sampling.vllm
        if config.url is not None:
            server = VLLMServer.attach(config.url)
        elif not config.launch:
            raise VLLMError("sampling.engine vllm: set sampling.vllm.url, or sampling.vllm.launch: true")
        else:
            key = id(base_weight(model)) if is_lora(model) else id(model)
            server = shared_server(key, lambda: launch_for(model, tokenizer, sampling))
        server.adapters += 1
        server.owners.append(model)  # the server outlives no model it was keyed by (ids are not reused)
        return cls(model, list(stop_ids), pad_id, sampling, server, prefix=f"a{server.adapters}")

    def reset_cache(self) -> None:
        """Nothing to drop here: the server keys its prefix cache by adapter, and :meth:`current`
        sends new weights before they are sampled."""

    def close(self) -> None:
        """Stop the server if this process launched it."""
        self.server.stop()

    # --- the weights --------------------------------------------------------------------------------
    def current(self) -> str:
        """The model name requests must ask for now: the weights as they are in memory, loaded
        first when they changed since the last load."""
        now = signature(self.model)
        if self.served is not None and self.served.signature == now:
            return self.served.name
        began = time.perf_counter()
        folder: Path | None
        if is_lora(self.model):
            if not self.server.lora:
                raise VLLMError("the vLLM server was started without --enable-lora, but the policy has LoRA adapters")
            name, folder = self._load_adapter()
        else:
            name, folder = self._reload_weights()
        if self.served is not None and self.served.folder is not None:
            shutil.rmtree(self.served.folder, ignore_errors=True)
        self.served = Served(name, now, folder)
        self.sync.syncs += 1
        self.sync.seconds += time.perf_counter() - began
        return name

    def _load_adapter(self) -> tuple[str, Path]:
        """Write the adapters and load them under a new name; the previous ones are unloaded and
        their folder removed."""
        name = f"{self.prefix}-{self.sync.syncs}"
        folder = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self._folder()))
        write_adapter(self.model, folder)
        self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(folder)}, text=True)
        listed = [m.get("id") for m in (self._get("/v1/models") or {}).get("data", []) if isinstance(m, dict)]
        if name not in listed:
            raise VLLMError(f"the vLLM server did not list adapter {name!r} after loading it (it lists {listed})")
        if self.served is not None and self.served.name != BASE_NAME:
            self._post("/v1/unload_lora_adapter", {"lora_name": self.served.name}, text=True)
        return name, folder

    def _reload_weights(self) -> tuple[str, Path | None]:
        """Full fine-tuning: write every weight and have the server reload them in place (the first
        time, the served base already is these weights), then drop its prefix cache."""
        if self.served is None:
            return BASE_NAME, None
        folder = Path(tempfile.mkdtemp(prefix="weights-", dir=self._folder()))
        write_full(self.model, folder)
        self._post("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}}, text=True)
        self._post("/reset_prefix_cache", None, text=True)
        return BASE_NAME, folder

    def _folder(self) -> Path:
        """Where this engine writes weights: the launched server's folder, else a scratch folder of
        its own (removed at exit)."""
        if self.server.folder is not None:
            return self.server.folder
        if self.scratch is None:
            self.scratch = Path(tempfile.mkdtemp(prefix="envace-vllm-sync-", dir=_tmp_root()))
            atexit.register(shutil.rmtree, self.scratch, True)
        return self.scratch

    # --- generation ---------------------------------------------------------------------------------
    @torch.no_grad()
    def stream(self, requests: list[Request], follow: Follow) -> None:
        """Send every request at once (at most ``vllm.max_concurrency`` in flight); as each answer
        arrives, ``follow`` it and send what its episode needs next. A failed request stops the
        stream with a :class:`VLLMError` (the others are abandoned)."""
        if not requests:
            return
        name = self.current()
        began, outside = time.perf_counter(), 0.0
        pool = ThreadPoolExecutor(max(1, self.sampling.vllm.max_concurrency), thread_name_prefix="vllm")
        pending: dict[Future[Sample], Request] = {}
        try:
            for request in requests:
                pending[pool.submit(self._complete, name, request, self._seed(request))] = request
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    request = pending.pop(future)
                    sample = future.result()
                    began_follow = time.perf_counter()
                    nxt = follow(request, sample)
                    outside += time.perf_counter() - began_follow
                    for r in nxt:
                        pending[pool.submit(self._complete, name, r, self._seed(r))] = r
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
            self.stats.seconds += time.perf_counter() - began - outside

    def _seed(self, request: Request) -> int | None:
        """The request's seed, drawn from its episode's stream (``None``: the server's own)."""
        if request.rng is None:
            return None
        return int(torch.randint(SEED_RANGE, (1,), generator=request.rng))

    def _complete(self, name: str, request: Request, seed: int | None) -> Sample:
        """One request, answered: its sample (the stop id included when one ended it)."""
        s = self.sampling
        body: dict[str, Any] = {
            "model": name, "prompt": request.prompt, "max_tokens": request.max_new_tokens,
            "temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k, "logprobs": 0,
            "stop_token_ids": self.stop_ids, "ignore_eos": True, "skip_special_tokens": False,
            "return_token_ids": True, "n": 1,
        }  # fmt: skip
        if seed is not None and s.temperature > 0:
            body["seed"] = seed
        answer = self._post("/v1/completions", body)
        ids, logprobs, stopped = completion_sample(answer, name)
        if stopped and (not ids or ids[-1] not in self.stop_ids):
            raise VLLMError(f"completion answer: finished by a stop, but its last id {ids[-1:]} is no stop id")
        usage = answer.get("usage") or {}
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        self.stats.calls += 1  # counters: one thread at a time updates each (the GIL), exact enough for rates
        self.stats.tokens += len(ids)
        self.stats.prompt_tokens += len(request.prompt)
        self.stats.prefill_tokens += len(request.prompt) - int(cached)
        return Sample(ids, logprobs, stopped)

    def _post(self, path: str, body: dict[str, Any] | None, text: bool = False) -> Any:
        timeout = self.sampling.vllm.request_timeout_s
        try:
            return call(self.server.url, path, body if body is not None else {}, timeout=timeout, text=text)
        except VLLMError as exc:
            raise VLLMError(f"{exc}{self.server.dead()}") from None

    def _get(self, path: str) -> Any:
        try:
            return call(self.server.url, path, timeout=self.sampling.vllm.request_timeout_s)
        except VLLMError as exc:
            raise VLLMError(f"{exc}{self.server.dead()}") from None


def base_weight(model: Any) -> Any:
    """A frozen base tensor of a LoRA model (its input embeddings): engines whose models share it
    sample from the same served base."""
    return model.get_base_model().get_input_embeddings().weight


def launch_for(model: Any, tokenizer: Any, sampling: SamplingConfig) -> VLLMServer:
    """Start a server of ``model``'s base weights (written to a temporary folder unless
    ``vllm.serve`` names what to load), in the sampling dtype, with LoRA when the model has adapters."""
    config = sampling.vllm
    vllm_python(config.venv)  # before anything is written: a missing venv is one line naming `make vllm`
    folder = Path(tempfile.mkdtemp(prefix="envace-vllm-", dir=_tmp_root()))
    try:
        param = next(model.parameters())
        device = param.device
        served = config.serve or str(write_base(model, tokenizer, folder / "base"))
        launch = Launch(served, serving_dtype(sampling, param.dtype, device.type), lora_rank(model),
                        device.index or 0 if device.type == "cuda" else None)  # fmt: skip
        return VLLMServer.launch(launch, config, folder)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


def serving_dtype(sampling: SamplingConfig, own: torch.dtype, device: str) -> str:
    """The server's ``--dtype``: ``vllm.dtype``, with ``auto`` resolved as ``sampling.dtype`` is
    (:func:`envace.hardware.sampling_dtype`), else the policy's own dtype."""
    if sampling.vllm.dtype != "auto":
        return sampling.vllm.dtype
    name = hardware.sampling_dtype(sampling.dtype, device)
    hardware.announce(hardware.describe("sampling.dtype (vLLM)", sampling.dtype, name or "policy's own", device))
    if name in ("bfloat16", "bf16"):
        return "bfloat16"
    if name in ("float32", "fp32"):
        return "float32"
    return "bfloat16" if own == torch.bfloat16 else "float32"


def _tmp_root() -> Path:
    root = cache_dir() / "vllm"
    root.mkdir(parents=True, exist_ok=True)
    return root
