"""The vLLM engine's client side against a stand-in server (stdlib HTTP on 127.0.0.1, seconds, no
vLLM needed): token ids in and out, weights synced under new names, stale or malformed answers
and a server that dies or hangs are clear errors. tests/rollout/test_vllm_server.py runs the real one."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import torch

from envace.policy import LoraSpec, apply_lora
from envace.rollout import SamplingConfig, make_engine
from envace.rollout.engine import Request
from envace.rollout.engine.vllm.config import VLLMConfig
from envace.rollout.engine.vllm.engine import VLLMEngine
from envace.rollout.engine.vllm.http import VLLMError
from envace.rollout.engine.vllm.server import VLLMServer, vllm_python
from envace.rollout.engine.vllm.weights import base_state

STOP = 2


class Fake:
    """What the stand-in server does (``mode``) and what it was sent."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.bodies: list[dict[str, Any]] = []
        self.loaded: dict[str, str] = {}
        self.calls: list[str] = []
        self.die_after = 10**9


def _answer(fake: Fake, body: dict[str, Any]) -> dict[str, Any]:
    """A completion: ids counting up from the prompt's last id, the stop id when the budget allows."""
    n, last = body["max_tokens"], body["prompt"][-1]
    ids = [last + 1 + i for i in range(min(n, 3))]
    stopped = n > 3
    ids += [STOP] if stopped else []
    model = "someone-else" if fake.mode == "stale" else body["model"]
    choice: dict[str, Any] = {"token_ids": ids, "logprobs": {"token_logprobs": [-0.5] * len(ids)},
                              "finish_reason": "stop" if stopped else "length"}  # fmt: skip
    if fake.mode == "malformed":
        del choice["token_ids"]
    return {"model": model, "choices": [choice], "usage": {"prompt_tokens_details": {"cached_tokens": 1}}}


def _handler(fake: Fake, server: list[ThreadingHTTPServer]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, payload: Any, code: int = 200) -> None:
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                return self._send(None)
            return self._send({"data": [{"id": "base"}, *({"id": n} for n in fake.loaded)]})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
            fake.calls.append(self.path)
            if self.path == "/v1/load_lora_adapter":
                assert (Path(body["lora_path"]) / "adapter_config.json").exists()
                fake.loaded[body["lora_name"]] = body["lora_path"]
                return self._send(None)
            if self.path == "/v1/unload_lora_adapter":
                fake.loaded.pop(body["lora_name"])
                return self._send(None)
            if self.path != "/v1/completions":
                fake.bodies.append(body)
                return self._send({"results": [None]})
            fake.bodies.append(body)
            if len(fake.bodies) > fake.die_after:  # killed: this request is cut, no one listens any more
                threading.Thread(target=server[0].shutdown).start()
                server[0].socket.close()
                self.close_connection = True
                self.connection.shutdown(2)
                return None
            if fake.mode == "hang":
                time.sleep(3)
            if body["model"] not in {"base", *fake.loaded}:
                return self._send({"error": {"message": f"The model `{body['model']}` does not exist."}}, 404)
            return self._send(_answer(fake, body))

    return Handler


class Quiet(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # the killed server's cut connections are the point, not news


@pytest.fixture()
def fake() -> Any:
    state, holder = Fake(), []
    httpd = Quiet(("127.0.0.1", 0), _handler(state, holder))
    holder.append(httpd)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    yield state
    httpd.shutdown()
    httpd.server_close()


def _engine(model: Any, fake: Fake, timeout: float = 10.0, temperature: float = 1.0) -> VLLMEngine:
    sampling = SamplingConfig(temperature=temperature, engine="vllm",
                              vllm=VLLMConfig(url=fake.url, request_timeout_s=timeout))  # fmt: skip
    return VLLMEngine(model, [STOP], 0, sampling, VLLMServer.attach(fake.url))


def _rng(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_tokens_in_tokens_out_and_follow_ups(fake: Fake, tiny_model: Any) -> None:
    engine = _engine(tiny_model, fake)
    got: list[tuple[list[int], list[int], bool]] = []

    def follow(request: Request, sample: Any) -> list[Request]:
        got.append((request.prompt, sample.ids, sample.stopped))
        if len(request.prompt) < 4:  # the episode's next turn extends its prompt by the sample
            return [Request(request.prompt + sample.ids, 2, request.rng)]
        return []

    engine.stream([Request([10, 11], 8, _rng(1)), Request([20], 8, _rng(2))], follow)
    assert sorted(got) == [([10, 11], [12, 13, 14, STOP], True), ([10, 11, 12, 13, 14, STOP], [3, 4], False),
                           ([20], [21, 22, 23, STOP], True), ([20, 21, 22, 23, STOP], [3, 4], False)]  # fmt: skip
    first = fake.bodies[0]
    assert first["stop_token_ids"] == [STOP] and first["ignore_eos"] and first["return_token_ids"]
    assert first["logprobs"] == 0 and first["model"] == "base" and isinstance(first["prompt"], list)
    assert engine.stats.tokens == 12 and engine.stats.calls == 4 and engine.stats.prompt_tokens == 2 + 1 + 6 + 5
    assert engine.stats.prefill_tokens == engine.stats.prompt_tokens - 4  # one cached token per answer
    seeds = {tuple(b["prompt"]): b["seed"] for b in fake.bodies}
    engine.stream([Request([10, 11], 8, _rng(1))], lambda r, s: [])  # the same stream: the same seed
    assert fake.bodies[-1]["seed"] == seeds[(10, 11)]
    with engine.decoding(0.0):  # greedy: no seed, temperature 0
        engine.generate([[5]], 2)
    assert fake.bodies[-1]["temperature"] == 0.0 and "seed" not in fake.bodies[-1]


def test_lora_adapters_sync_under_a_new_name_after_each_update(fake: Fake, tiny_model: Any) -> None:
    model = apply_lora(tiny_model, LoraSpec(r=4))
    engine = _engine(model, fake)
    engine.generate([[5]], 2)
    assert list(fake.loaded) == ["policy-0"] and fake.bodies[-1]["model"] == "policy-0"
    engine.generate([[5]], 2)  # weights unchanged: nothing written or loaded again
    assert fake.calls.count("/v1/load_lora_adapter") == 1
    trainable = [p for p in model.parameters() if p.requires_grad]
    trainable[0].data.add_(0.01)  # an update, in place (as the optimizer writes it)
    engine.generate([[5]], 2)
    assert list(fake.loaded) == ["policy-1"] and fake.bodies[-1]["model"] == "policy-1"  # the old one unloaded
    assert engine.sync.syncs == 2
    fake.loaded.clear()  # the server lost it (restarted behind our back): an error, never the base
    with pytest.raises(VLLMError, match="policy-1.*does not exist"):
        engine.generate([[5]], 2)


def test_full_weights_reload_in_place_after_an_update(fake: Fake, tiny_model: Any) -> None:
    engine = _engine(tiny_model, fake)
    engine.generate([[5]], 2)
    assert "/collective_rpc" not in fake.calls  # the served base already is these weights
    next(tiny_model.parameters()).data.mul_(1.5)
    engine.generate([[5]], 2)
    rpc = next(b for b in fake.bodies if b.get("method") == "reload_weights")
    written = Path(rpc["kwargs"]["weights_path"]) / "model.safetensors"
    from safetensors.torch import load_file

    saved = load_file(str(written))
    torch.testing.assert_close(saved["model.embed_tokens.weight"], tiny_model.model.embed_tokens.weight)
    assert "lm_head.weight" not in saved  # tied: written once
    assert fake.calls[-2:] == ["/reset_prefix_cache", "/v1/completions"]


def test_base_state_strips_the_adapters(tiny_model: Any) -> None:
    plain = set(tiny_model.state_dict())
    assert set(base_state(apply_lora(tiny_model, LoraSpec(r=4)))) == plain


@pytest.mark.parametrize(("mode", "error"), [
    ("stale", "model 'someone-else', but 'base' was asked for"),
    ("malformed", r"choices\[0\].token_ids: expected a list of integers"),
])  # fmt: skip
def test_a_wrong_answer_is_a_clear_error(fake: Fake, tiny_model: Any, mode: str, error: str) -> None:
    fake.mode = mode
    with pytest.raises(VLLMError, match=error):
        _engine(tiny_model, fake).generate([[5]], 2)


def test_a_server_killed_mid_rollout_is_an_error_not_a_hang(fake: Fake, tiny_model: Any) -> None:
    fake.die_after = 3
    began = time.perf_counter()
    with pytest.raises(VLLMError, match="no answer"):
        _engine(tiny_model, fake).generate([[i] for i in range(10, 30)], 8)
    assert time.perf_counter() - began < 5


def test_a_silent_server_times_out(fake: Fake, tiny_model: Any) -> None:
    fake.mode = "hang"
    began = time.perf_counter()
    with pytest.raises(VLLMError, match="timed out"):
        _engine(tiny_model, fake, timeout=0.5).generate([[5]], 2)
    assert time.perf_counter() - began < 3


def test_no_vllm_venv_is_one_line_naming_make_vllm(tiny_model: Any, tokenizer: Any) -> None:
    with pytest.raises(VLLMError, match=r"no vLLM environment at /nowhere/.venv-vllm: run `make vllm`") as info:
        vllm_python("/nowhere/.venv-vllm")
    assert "\n" not in str(info.value)
    from envace.protocol.render import HermesFormat

    sampling = SamplingConfig(engine="vllm", vllm=VLLMConfig(venv="/nowhere/.venv-vllm", serve="/nowhere"))
    with pytest.raises(VLLMError, match="run `make vllm`"):
        make_engine(tiny_model, tokenizer, HermesFormat(), sampling)


def test_unknown_engine_is_refused() -> None:
    with pytest.raises(ValueError, match="sampling.engine must be one of envace, vllm"):
        SamplingConfig(engine="sglang")


def test_fit_preflight_names_make_vllm_before_anything_is_built() -> None:
    from envace.commands.errors import UsageError
    from envace.commands.preflight import check_vllm

    check_vllm({"engine": "envace", "vllm": {"venv": "/nowhere"}})  # our engine: nothing to check
    check_vllm({"engine": "vllm", "vllm": {"url": "http://127.0.0.1:1", "venv": "/nowhere"}})  # attached: no venv
    with pytest.raises(UsageError, match=r"no vLLM environment at /nowhere: run `make vllm`"):
        check_vllm({"engine": "vllm", "vllm": {"venv": "/nowhere"}})


def test_a_crashed_servers_cause_is_quoted_and_its_log_kept(tmp_path: Path) -> None:
    """A server that ended by itself: the error quotes the log's error lines, which its shutdown noise
    would bury below the tail, and the log survives the removal of the server's folder."""
    import subprocess
    import sys

    folder = tmp_path / "server-1"
    folder.mkdir()
    log = folder / "server.log"
    noise = [f"shutdown noise {i}" for i in range(30)]
    log.write_text("\n".join(["starting", "ERROR EngineCore failed: RuntimeError: the cause", *noise]) + "\n")
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    server = VLLMServer("http://127.0.0.1:9", process, log, folder)
    why = server.dead()
    assert "exited with code 0" in why and "the cause" in why and "shutdown noise 29" in why
    server.stop()
    assert not folder.exists() and server.log is not None and server.log.exists()
    assert str(server.log) in why and "the cause" in server.log.read_text()
