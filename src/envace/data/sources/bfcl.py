"""BFCL-v4 multi-turn records as canonical :class:`~envace.types.Task` objects and the class split, and
what the single-turn source (:mod:`envace.data.sources.bfcl_single`) shares with them (the gold replay
through bfcl-eval's checker is :mod:`envace.data.sources.bfcl_verify`).

Records come from bfcl-eval's wheel (:func:`envace._bfcl.bfcl_data_dir`) or from a folder with the
same layout (``BFCL_v4_<category>.json`` JSONL files, ``possible_answer/``, ``multi_turn_func_doc/``).
See ``docs/data.md`` for the split, the user-turn convention and the measured figures.
"""

from __future__ import annotations

import ast
import copy
import keyword
from pathlib import Path
from typing import Any

from envace._bfcl import bfcl_data_dir, bfcl_module
from envace.data.sources import records
from envace.data.sources.records import RecordError
from envace.protocol.parse import tool_name
from envace.types import Task, ToolCall, ToolSchema

PREFIX = "BFCL_v4"
SINGLE_TURN_CATEGORIES = (
    "simple_python",
    "simple_java",
    "simple_javascript",
    "multiple",
    "parallel",
    "parallel_multiple",
    "irrelevance",
    "live_simple",
    "live_multiple",
    "live_parallel",
    "live_parallel_multiple",
    "live_irrelevance",
    "live_relevance",
)
MULTI_TURN_CATEGORIES = (
    "multi_turn_base",
    "multi_turn_miss_func",
    "multi_turn_miss_param",
    "multi_turn_long_context",
)
# Multi-turn split by involved API classes: a scenario is a training-class scenario when all its
# classes are here: 89 of the 200 scenarios (x 4 categories = 356 tasks, 44.5 %). GorillaFileSystem,
# TicketAPI and TravelAPI are never seen in training ("test"). Of the training-class scenarios, those
# whose index is VAL_RESIDUE modulo VAL_MODULUS (13 scenarios, 52 tasks, seven class sets) are held
# out as "val": unseen requests on the tools training shows (docs/data.md). Those whose index is
# TUNE_RESIDUE modulo VAL_MODULUS are carved from training as "tune": the split on which a training
# recipe is chosen, so that no recipe is ever chosen by a held-out figure (docs/training.md).
TRAIN_CLASSES = frozenset({"MathAPI", "MessageAPI", "TradingBot", "TwitterAPI", "VehicleControlAPI"})
VAL_MODULUS, VAL_RESIDUE, TUNE_RESIDUE = 8, 3, 7
SPLITS = ("train", "tune", "val", "test", "all")
# What bfcl-eval's FC inference says at a ``missed_function`` turn (its question is empty).
ADDED_FUNCTIONS_PROMPT = "I have updated some more functions you can choose from. What about now?"


def read_jsonl(file: Path) -> list[tuple[int, dict[str, Any]]]:
    """``(line number, record)`` for each non-blank line of a JSONL file; every record an object."""
    if not file.is_file():
        raise FileNotFoundError(f"BFCL data file not found: {file}")
    rows = records.read_jsonl(file)
    for n, record in rows:
        if not isinstance(record, dict):
            raise RecordError(file, n, None, f"a record must be a JSON object, got {type(record).__name__}")
    return rows


def _get(record: dict[str, Any], name: str, kind: type | tuple[type, ...], file: Path, line: int) -> Any:
    if name not in record:
        raise RecordError(file, line, name, "missing")
    if not isinstance(record[name], kind):
        expected = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise RecordError(file, line, name, f"expected {expected}, got {type(record[name]).__name__}")
    return record[name]


def _data_dir(path: str | Path | None) -> Path:
    root = Path(path) if path is not None else bfcl_data_dir()
    if not root.is_dir():
        raise FileNotFoundError(f"BFCL data folder not found: {root}")
    return root


def _categories(requested: list[str] | None, known: tuple[str, ...]) -> list[str]:
    cats = list(requested) if requested else list(known)
    unknown = [c for c in cats if c not in known]
    if unknown:
        raise ValueError(f"unknown BFCL categories {unknown}; known: {', '.join(known)}")
    return cats


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")


# --------------------------------------------------------------------------- gold call strings


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple | list | set | frozenset):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, bytes | complex):
        raise ValueError(f"{type(value).__name__} literals are not JSON")
    return value


def parse_call_string(text: str, tools: list[ToolSchema]) -> ToolCall:
    """Parse a gold call string like ``"mv(source='a', destination='b')"`` without evaluating it.

    Keyword values are read with ``ast.literal_eval``; positional arguments take the parameter
    names of the tool's schema in order. Tuples become lists (JSON).

    >>> tools = [{"name": "sort", "parameters": {"properties": {"file_name": {}, "reverse": {}}}}]
    >>> parse_call_string("sort('a (1).txt', reverse=-1)", tools)
    ToolCall(name='sort', arguments={'file_name': 'a (1).txt', 'reverse': -1})
    """
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as exc:
        raise ValueError(f"not a call: {text!r} ({exc.msg})") from None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"not a plain function call: {text!r}")
    name = node.func.id
    schemas = {tool_name(t): t for t in tools}
    params = list(((schemas.get(name) or {}).get("parameters") or {}).get("properties") or {})
    if len(node.args) > len(params):
        raise ValueError(f"{text!r}: {len(node.args)} positional arguments, schema of {name!r} names {params}")
    arguments: dict[str, Any] = {}
    pairs = list(zip(params, node.args, strict=False)) + [(k.arg, k.value) for k in node.keywords]
    for key, value in pairs:
        if key is None or isinstance(value, ast.Starred):
            raise ValueError(f"{text!r}: */** arguments are not supported")
        if key in arguments:
            raise ValueError(f"{text!r}: argument {key!r} given twice")
        try:
            arguments[key] = _jsonable(ast.literal_eval(value))  # safe: literals only, of BFCL gold data
        except (ValueError, TypeError, SyntaxError, RecursionError) as exc:
            raise ValueError(f"{text!r}: argument {key!r} is not a literal ({exc})") from None
    return ToolCall(name, arguments)


def call_string(call: ToolCall) -> str:
    """The Python call string bfcl-eval's checkers execute, rebuilt from validated values.

    Values are ``repr`` of JSON values (Python literals); a name that is not a plain identifier
    raises ``ValueError``.

    >>> call_string(ToolCall("mv", {"source": "a'b", "n": [1, -2.5], "ok": True}))
    'mv(source="a\\'b", n=[1, -2.5], ok=True)'
    """
    names = [call.name, *call.arguments]
    bad = [n for n in names if not isinstance(n, str) or not n.isidentifier() or keyword.iskeyword(n)]
    if bad:  # argument names reach bfcl-eval's eval: only plain identifiers may pass
        raise ValueError(f"not a Python identifier: {bad}")
    return f"{call.name}({', '.join(f'{k}={v!r}' for k, v in call.arguments.items())})"


# --------------------------------------------------------------------------- multi turn


def _messages(question: list[Any], file: Path, line: int) -> list[list[dict[str, str]]]:
    for i, turn in enumerate(question):
        if not isinstance(turn, list):
            raise RecordError(file, line, f"question[{i}]", "a turn must be a list of messages")
        for j, msg in enumerate(turn):
            if (
                not isinstance(msg, dict)
                or not isinstance(msg.get("role"), str)
                or not isinstance(msg.get("content"), str)
            ):
                raise RecordError(file, line, f"question[{i}][{j}]", "a message needs string 'role' and 'content'")
    return question


def user_text(turn: list[dict[str, str]]) -> str:
    """One user turn's text: its user messages joined by a blank line (BFCL turns hold one)."""
    return "\n\n".join(m["content"] for m in turn if m["role"] == "user")


def in_train_split(involved_classes: list[str]) -> bool:
    """True when every involved class is a :data:`TRAIN_CLASSES` class (the scenario is in ``train``
    or ``val``)."""
    return set(involved_classes) <= TRAIN_CLASSES


def split_of(task_id: str, involved_classes: list[str]) -> str:
    """The split of a multi-turn task: ``test`` when it involves a held-out class, else ``val`` for
    one training-class scenario in :data:`VAL_MODULUS` (by the scenario index that ends the id,
    shared by the four categories), ``tune`` for another one in :data:`VAL_MODULUS`, else ``train``.

    >>> [split_of(f"multi_turn_base_{i}", ["TradingBot"]) for i in (3, 4, 7)]
    ['val', 'train', 'tune']
    >>> split_of("multi_turn_miss_func_3", ["GorillaFileSystem"])
    'test'
    """
    if not in_train_split(involved_classes):
        return "test"
    residue = int(task_id.rsplit("_", 1)[1]) % VAL_MODULUS
    return {VAL_RESIDUE: "val", TUNE_RESIDUE: "tune"}.get(residue, "train")


def scenario_of(task_id: str) -> str | None:
    """The scenario a multi-turn task belongs to, shared by its four categories (``None`` for any
    other id): their first turns start from one state and, in three of four cases, one question, so
    their outcomes are not independent and the experiment report resamples scenarios, not tasks.

    >>> scenario_of("multi_turn_miss_param_59"), scenario_of("multi_turn_base_59"), scenario_of("simple_python_3")
    ('multi_turn_59', 'multi_turn_59', None)
    """
    for category in MULTI_TURN_CATEGORIES:
        index = task_id.removeprefix(category + "_")
        if index != task_id and index.isascii() and index.isdigit():
            return f"multi_turn_{index}"
    return None


def _class_docs(root: Path, class_name: str, cache: dict[str, list[ToolSchema]]) -> list[ToolSchema]:
    if class_name not in cache:
        mapping = bfcl_module("constants.executable_backend_config").MULTI_TURN_FUNC_DOC_FILE_MAPPING
        if class_name not in mapping:
            raise ValueError(f"unknown BFCL class {class_name!r}")
        file = root / "multi_turn_func_doc" / mapping[class_name]
        cache[class_name] = [rec for _, rec in read_jsonl(file)]
    return copy.deepcopy(cache[class_name])


def _parse_gold(gold: list[Any], tools: list[ToolSchema], file: Path, line: int) -> list[list[ToolCall]]:
    turns = []
    for i, turn in enumerate(gold):
        if not isinstance(turn, list):
            raise RecordError(file, line, f"ground_truth[{i}]", "a turn must be a list of call strings")
        calls = []
        for j, text in enumerate(turn):
            try:
                if not isinstance(text, str):
                    raise ValueError(f"expected a call string, got {type(text).__name__}")
                calls.append(parse_call_string(text, tools))
            except ValueError as exc:
                raise RecordError(file, line, f"ground_truth[{i}][{j}]", str(exc)) from None
        turns.append(calls)
    return turns


def _multi_turn_task(
    rec: dict[str, Any],
    gold: list[Any],
    category: str,
    where: tuple[Path, int, Path, int],
    docs: dict[str, list[ToolSchema]],
    root: Path,
) -> Task:
    file, n, answer_file, answer_line = where
    task_id = _get(rec, "id", str, file, n)
    question = _messages(_get(rec, "question", list, file, n), file, n)
    classes = _get(rec, "involved_classes", list, file, n)
    missed = rec.get("missed_function") or {}
    tools = [doc for c in classes for doc in _class_docs(root, c, docs)]
    tools_added: dict[str, list[ToolSchema]] = {}
    for turn, names in missed.items():  # bfcl-eval's populate_test_cases_with_predefined_functions
        for name in names:
            doc = next((d for d in tools if d["name"] == name), None)
            if doc is None:
                raise RecordError(file, n, f"missed_function[{turn}]", f"no tool {name!r} in {classes}")
            tools.remove(doc)
            tools_added.setdefault(str(turn), []).append(doc)
    if len(gold) != len(question):
        raise RecordError(answer_file, answer_line, "ground_truth", f"{len(gold)} turns, question has {len(question)}")
    user_turns = []
    for i, turn in enumerate(question):
        if not turn and str(i) not in missed:
            raise RecordError(file, n, f"question[{i}]", "empty turn without a missed_function")
        user_turns.append(user_text(turn) if turn else ADDED_FUNCTIONS_PROMPT)
    task = Task(
        id=task_id, benchmark="bfcl", category=category, tools=tools, user_turns=user_turns, tools_added=tools_added
    )
    task.gold = _parse_gold(gold, task.tools_at(len(question)), answer_file, answer_line)
    task.env = {
        "kind": "bfcl",
        "initial_config": rec.get("initial_config") or {},
        "involved_classes": classes,
        "long_context": category == "multi_turn_long_context",
        "id": task_id,
    }
    task.extra = {
        "ground_truth": gold,
        "path": rec.get("path", []),
        "excluded_function": rec.get("excluded_function", []),
        "split": split_of(task_id, classes),
    }
    return task


def _multi_turn_tasks(root: Path, category: str, docs: dict[str, list[ToolSchema]]) -> list[Task]:
    file = root / f"{PREFIX}_{category}.json"
    answer_file = root / "possible_answer" / f"{PREFIX}_{category}.json"
    gold = {}
    for n, rec in read_jsonl(answer_file):
        gold[_get(rec, "id", str, answer_file, n)] = (n, _get(rec, "ground_truth", list, answer_file, n))
    tasks = []
    for n, rec in read_jsonl(file):
        task_id = _get(rec, "id", str, file, n)
        if task_id not in gold:
            raise RecordError(file, n, "id", f"{task_id} has no ground truth in {answer_file}")
        answer_line, truth = gold[task_id]
        tasks.append(_multi_turn_task(rec, truth, category, (file, n, answer_file, answer_line), docs, root))
    return tasks


def load_multi_turn(split: str = "all", path: str | None = None, categories: list[str] | None = None) -> list[Task]:
    """Load BFCL-v4 multi-turn tasks (base, miss_func, miss_param, long_context; 800 in all).

    Args:
        split: ``train`` (all involved classes in :data:`TRAIN_CLASSES`, less the ``val`` and
            ``tune`` scenarios), ``val`` (held-out scenarios of those classes), ``tune`` (scenarios
            of those classes kept from training to choose a recipe on), ``test`` (the rest: a
            held-out class is involved) or ``all`` (the full official set); see :func:`split_of`.
        path: a folder laid out like bfcl-eval's ``data/``; default: the installed wheel's.
        categories: a subset of :data:`MULTI_TURN_CATEGORIES`; default: all four.
    """
    _check_split(split)
    root = _data_dir(path)
    docs: dict[str, list[ToolSchema]] = {}
    tasks = [t for c in _categories(categories, MULTI_TURN_CATEGORIES) for t in _multi_turn_tasks(root, c, docs)]
    return tasks if split == "all" else [t for t in tasks if t.extra["split"] == split]
