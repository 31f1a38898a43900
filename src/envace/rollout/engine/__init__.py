"""Batched sampling over token-id prompts: the one generation path of the rollout.

Prompts are lists of ids (tokens in); the engine returns the sampled ids and their log-probs
(tokens out). Generations run in one batch with left padding, attention masks and a KV cache, and
continuously: when a row ends, the generation its episode needs next joins the rows still decoding.
Keys and values are reused wherever they are already known. The package, by concern:

* :mod:`~envace.rollout.engine.sampling`: what a generation asks for and returns
  (:class:`Request`, :class:`Sample`, :class:`SamplingConfig`, :class:`EngineStats`) and the pure
  draw of each token (temperature, top-k, top-p, the row's own random stream);
* :mod:`~envace.rollout.engine.protocol`: :class:`Engine`, what the rollout loop needs of an engine;
* :mod:`~envace.rollout.engine.engine`: :class:`GenerationEngine`, the continuous-batching loop
  (prefill, step, join, leave) over a sampling copy of the policy;
* :mod:`~envace.rollout.engine.batch`: the running batch's bookkeeping (rows join, leave, compact);
* :mod:`~envace.rollout.engine.kv`: in-place KV storage (:class:`GrowingLayer`) and a prefill's layout;
* :mod:`~envace.rollout.engine.kept`: the shared prefixes and ended rows kept between calls;
* :mod:`~envace.rollout.engine.packed`: the CPU fast path, oneDNN-prepacked linear layers
  (:class:`PackedLinear`) and the bf16 attention path;
* :mod:`~envace.rollout.engine.vllm`: the other engine, a vLLM server in its own venv driven over
  HTTP (``sampling.engine: vllm``), the trained weights synced to it after every update.
"""

from envace.rollout.engine.engine import GenerationEngine
from envace.rollout.engine.kv import KV, LEAD, GrowingLayer
from envace.rollout.engine.packed import PackedLinear, packed_copy, register_attention
from envace.rollout.engine.protocol import Engine, SamplingEngine
from envace.rollout.engine.sampling import SAMPLING_DTYPES, EngineStats, Follow, Request, Sample, SamplingConfig, draw

__all__ = [
    "KV",
    "LEAD",
    "SAMPLING_DTYPES",
    "Engine",
    "EngineStats",
    "Follow",
    "GenerationEngine",
    "GrowingLayer",
    "PackedLinear",
    "Request",
    "Sample",
    "SamplingConfig",
    "SamplingEngine",
    "draw",
    "packed_copy",
    "register_attention",
]
