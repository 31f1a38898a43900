"""The BFCL single-turn oracle: one call per function of the possible answer, with its first
acceptable values, written as the checker expects a model to write them.

Python categories take the values as they are. For Java and JavaScript, BFCL's models write every
argument as source text (a string) and the checker converts it by the parameter's declared type
(``java_type_converter``/``js_type_converter``), so the oracle writes each value as the source text
that converts back to it (``true``, ``5L``, ``new ArrayList<>(Arrays.asList(...))``, ``[1, 2]``, ...).
``live_relevance`` has no possible answer (any call passes): the oracle calls the first function.
"""

from __future__ import annotations

import json
from typing import Any

from envace.types import Task, ToolCall

OMIT = object()  # the parameter is left out of the call


def pick(options: Any, required: bool | None = True) -> Any:
    """The oracle's value for one parameter's possible-answer list: :data:`OMIT` when the parameter is
    optional and ``""`` (left out) is acceptable, else the first value that is not ``""``.

    A required parameter whose only acceptable value is ``""`` gets ``""`` itself: the checker
    rejects a call without a required parameter, and compares a string value with the acceptable
    ones after stripping spaces and ``,./-_*^``, so ``""`` matches ``""``. A list with no value at all
    (``[]``) accepts nothing: the parameter is left out. ``required=None`` (no function doc) picks as
    for a required parameter but leaves out one whose only value is ``""``.

    A possible answer that is a bare string instead of a list (one BFCL record) is iterated as the
    checker iterates it: character by character.

    >>> pick([3, 4]), pick(["", 3]), pick(["", 3], required=False) is OMIT, pick([None]), pick("ab")
    (3, 3, True, None, 'a')
    >>> pick([""]), pick([""], required=False) is OMIT, pick([]) is OMIT
    ('', True, True)
    >>> pick([{"k": ["a", "b"], "o": [""]}])
    {'k': 'a'}
    """
    values = list(options) if isinstance(options, list | str) else [options]
    if required is False and "" in values:
        return OMIT
    chosen = [v for v in values if v != ""]
    if chosen:
        return _literal(chosen[0])
    return "" if required and values else OMIT


def _literal(value: Any) -> Any:
    if isinstance(value, dict):  # nested dicts list their own alternatives per key
        return {k: v for k, v in ((k, pick(o, required=False)) for k, o in value.items()) if v is not OMIT}
    if isinstance(value, list):
        return [_literal(v) for v in value]
    return value


def java_value(v: Any) -> str:
    """A Java literal read back by the checker's type-less ``parse_java_value``."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    return str(v)


def java_source(v: Any, typ: str, nested: str | None = None) -> str:
    """Java source text that ``java_type_converter(text, typ, nested)`` turns back into ``v``.

    >>> java_source(True, "boolean"), java_source(5, "long"), java_source([1, 2], "ArrayList", "integer")
    ('true', '5L', 'new ArrayList<>(Arrays.asList(1, 2))')
    """
    if isinstance(v, str):
        return v
    if typ == "boolean" or isinstance(v, bool):
        return "true" if v else "false"
    if typ == "long":
        return f"{int(v)}L"
    if typ == "float":
        return f"{float(v)}f"
    if typ in ("ArrayList", "Array"):
        if nested == "String":
            items = [f'"{e}"' if typ == "ArrayList" else str(e) for e in v]
        else:
            items = [java_source(e, nested) if nested else java_value(e) for e in v]
        if typ == "Array":
            return f"new {nested or 'Object'}[]{{{', '.join(items)}}}"
        return f"new ArrayList<>(Arrays.asList({', '.join(items)}))" if items else "new ArrayList<>()"
    if typ == "HashMap":
        puts = " ".join(f'put("{k}", {java_value(x)});' for k, x in v.items())
        return f"new HashMap<String, Object>() {{{{ {puts} }}}}"
    return str(v)


def js_value(v: Any) -> str:
    """A JavaScript literal read back by the checker's ``parse_js_value`` / collection parser."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, list):
        return "[" + ", ".join(js_value(e) for e in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {js_value(x)}" for k, x in v.items()) + "}"
    return json.dumps(v)


def js_source(v: Any, typ: str, nested: str | None = None) -> str:
    """JavaScript source text that ``js_type_converter(text, typ, nested)`` turns back into ``v``.

    >>> js_source(True, "Boolean"), js_source([60, 30], "array"), js_source(7, "Bigint")
    ('true', '[60, 30]', '7n')
    """
    if isinstance(v, str):
        return v
    if typ == "Bigint":
        return f"{int(v)}n"
    return js_value(v)


def _params(doc: dict[str, Any]) -> dict[str, Any]:
    return dict((doc.get("parameters") or {}).get("properties") or {})


def reference_calls(task: Task, docs: list[dict[str, Any]] | None = None) -> list[ToolCall]:
    """The oracle's calls for a single-turn task (see the module docstring).

    ``docs`` are the checker's function docs (with the original Java/JavaScript types).

    >>> t = Task("t", "bfcl", extra={"possible_answer": [{"f": {"a": [3, 4], "b": ["", "x"], "c": [""]}}]})
    >>> reference_calls(t)
    [ToolCall(name='f', arguments={'a': 3, 'b': 'x'})]
    """
    answer = task.extra.get("possible_answer")
    if not answer:
        if task.category != "live_relevance" or not task.tools:
            return []
        return [ToolCall(str(task.tools[0].get("function", task.tools[0])["name"]), {})]
    language = task.extra.get("language", "python")
    by_name = {str(d["name"]): d for d in docs or []}
    calls = []
    for entry in answer:
        for name, params in entry.items():
            doc = by_name.get(name, {})
            required = set((doc.get("parameters") or {}).get("required") or [])
            picked = {k: pick(o, required=(k in required) if doc else None) for k, o in params.items()}
            args = {k: v for k, v in picked.items() if v is not OMIT}
            if language != "python":
                schema = _params(doc)
                args = {k: _source(v, schema.get(k) or {}, language) for k, v in args.items()}
            calls.append(ToolCall(name, args))
    return calls


def _source(v: Any, schema: dict[str, Any], language: str) -> str:
    typ = str(schema.get("type", "any"))
    nested = (schema.get("items") or {}).get("type")
    return java_source(v, typ, nested) if language == "java" else js_source(v, typ, nested)
