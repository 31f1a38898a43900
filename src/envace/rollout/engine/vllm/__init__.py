"""vLLM as the rollout engine (``sampling.engine: vllm``; docs/vllm.md), by concern:

* :mod:`~envace.rollout.engine.vllm.config`: :class:`VLLMConfig`, where the server is and how it starts;
* :mod:`~envace.rollout.engine.vllm.server`: the server's lifecycle (own venv, loopback port, health
  check, stopped with the process);
* :mod:`~envace.rollout.engine.vllm.http`: bounded JSON calls and the checked completion answer;
* :mod:`~envace.rollout.engine.vllm.weights`: the base written once, the adapters (or all weights)
  after every update;
* :mod:`~envace.rollout.engine.vllm.engine`: :class:`VLLMEngine`, the
  :class:`~envace.rollout.engine.Engine` over the server.

Nothing is imported here: :mod:`~envace.rollout.engine.sampling` imports the config, and the engine
imports the sampling module.
"""
