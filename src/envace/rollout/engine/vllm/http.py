"""JSON over HTTP to the vLLM server, every call bounded, every failure one :class:`VLLMError`.

The server is a third party: its answers are checked field by field (:func:`completion_sample`)
before anything reaches an episode.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

#: most characters of a server's error body quoted in a message
QUOTED = 400


class VLLMError(RuntimeError):
    """The vLLM server failed, stopped answering, or answered something malformed."""


def call(url: str, path: str, body: dict[str, Any] | None = None, timeout: float = 30.0, text: bool = False) -> Any:
    """``POST`` ``body`` (``GET`` without one) to ``url + path``; the decoded JSON answer (``None`` for
    an empty one; with ``text``, the answer as text: vLLM's LoRA endpoints answer a sentence).
    ``timeout`` bounds the connection and every read: a server that goes silent for that long is an
    error, not a hang."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            raw = answer.read()
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", "replace")[:QUOTED]
        raise VLLMError(f"{url}{path}: HTTP {exc.code}: {detail}") from None
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise VLLMError(f"{url}{path}: no answer ({type(reason).__name__}: {reason})") from None
    if text:
        return raw.decode("utf-8", "replace")
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except ValueError:
        raise VLLMError(f"{url}{path}: not JSON: {raw[:QUOTED]!r}") from None


def completion_sample(answer: Any, model: str) -> tuple[list[int], list[float], bool]:
    """The generated ids, their log-probs and whether a stop id ended them, from a ``/v1/completions``
    answer to a request for ``model``. Raises :class:`VLLMError` naming the field that is wrong; an
    answer from another model than the one asked for (a stale adapter) is one of them."""
    if not isinstance(answer, dict):
        raise VLLMError(f"completion answer: expected an object, got {type(answer).__name__}")
    if answer.get("model") != model:
        raise VLLMError(f"completion answer: model {answer.get('model')!r}, but {model!r} was asked for")
    choices = answer.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        raise VLLMError("completion answer: choices: expected one choice")
    choice = choices[0]
    ids, logprobs = choice.get("token_ids"), (choice.get("logprobs") or {}).get("token_logprobs")
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise VLLMError("completion answer: choices[0].token_ids: expected a list of integers (return_token_ids)")
    if not isinstance(logprobs, list) or len(logprobs) != len(ids):
        raise VLLMError(f"completion answer: choices[0].logprobs.token_logprobs: expected {len(ids)} numbers")
    if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in logprobs):
        raise VLLMError("completion answer: choices[0].logprobs.token_logprobs: a value is not a number")
    reason = choice.get("finish_reason")
    if reason not in ("stop", "length"):
        raise VLLMError(f"completion answer: choices[0].finish_reason {reason!r} (expected stop or length)")
    return ids, [float(x) for x in logprobs], reason == "stop"
