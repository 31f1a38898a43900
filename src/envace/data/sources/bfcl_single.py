"""BFCL-v4 single-turn records as :class:`~envace.types.Task` objects, and their declared train/test split.

The split (``docs/data.md``) is by the functions an item's possible answer calls: each function name
falls in one half by the CRC-32 of its UTF-8 bytes (even: ``train``, odd: ``test``), and an item is in
a half when every function it calls is. An item that calls functions of both halves (only
``parallel_multiple`` has such items) is in neither, so no held-out item shares a called function
with a training item. CRC-32 is fixed by its standard, not by Python's per-process string hash: the
split is the same in every process and on every machine. Categories without a possible answer
(``irrelevance``, ``live_irrelevance``, ``live_relevance``) call nothing and have no declared split.

Every task's ``gold`` is its one turn's supervised target: one call per function of the possible
answer with the first acceptable value of each argument
(:func:`envace.data.sources.bfcl_reference.reference_calls`, the oracle of ``envace evaluate``),
all in one act step (``extra["first_step_answer"]``: BFCL scores the first response only).
"""

from __future__ import annotations

import copy
import zlib
from pathlib import Path
from typing import Any

from envace._bfcl import bfcl_module
from envace.data.sources.bfcl import (
    PREFIX,
    SINGLE_TURN_CATEGORIES,
    _categories,
    _data_dir,
    _get,
    _messages,
    read_jsonl,
    user_text,
)
from envace.data.sources.bfcl_reference import reference_calls
from envace.data.sources.records import RecordError
from envace.types import Task

SINGLE_TURN_SPLITS = ("train", "test", "all")
STRADDLES = "straddles"  # an item calling functions of both halves: in neither split


def function_half(name: str) -> str:
    """The half a called function's name falls in: ``train`` when the CRC-32 of its UTF-8 bytes is
    even, else ``test``.

    >>> function_half("math.factorial"), function_half("calc_area")
    ('train', 'test')
    """
    return "train" if zlib.crc32(name.encode("utf-8")) % 2 == 0 else "test"


def called_functions(possible_answer: list[Any] | None) -> list[str]:
    """The distinct names of the functions a possible answer calls, in order (none without an answer).

    >>> called_functions([{"f": {"a": [1]}}, {"g": {}}, {"f": {"a": [2]}}]), called_functions(None)
    (['f', 'g'], [])
    """
    names: list[str] = []
    for entry in possible_answer or []:
        names += [str(n) for n in entry if str(n) not in names]
    return names


def split_of_answer(possible_answer: list[Any] | None) -> str | None:
    """The declared split of a single-turn item: ``train`` or ``test`` when every function it calls is
    in that half, :data:`STRADDLES` when it calls both, ``None`` when it calls none (no possible answer).

    >>> both = [{"math.factorial": {}}, {"calc_area": {}}]
    >>> split_of_answer([{"math.factorial": {}}]), split_of_answer(both), split_of_answer(None)
    ('train', 'straddles', None)
    """
    halves = {function_half(n) for n in called_functions(possible_answer)}
    if not halves:
        return None
    return halves.pop() if len(halves) == 1 else STRADDLES


def _task(rec: dict[str, Any], answer: list[Any] | None, category: str, where: tuple[Path, int], utils: Any) -> Task:
    file, n = where
    task_id = _get(rec, "id", str, file, n)
    original = copy.deepcopy(_get(rec, "function", list, file, n))
    functions = copy.deepcopy(original)
    if utils is not None:  # what bfcl-eval's own inference shows the model (types, hints)
        functions = utils._func_doc_language_specific_pre_processing(functions, category)
    messages = _messages(_get(rec, "question", list, file, n), file, n)
    if len(messages) != 1:
        raise RecordError(file, n, "question", f"expected one turn, got {len(messages)}")
    language = "java" if category.endswith("_java") else "javascript" if category.endswith("_javascript") else "python"
    task = Task(
        id=task_id,
        benchmark="bfcl",
        category=category,
        tools=functions,
        system_prompt="\n\n".join(m["content"] for m in messages[0] if m["role"] == "system"),
        user_turns=[user_text(messages[0])],
        extra={
            "possible_answer": answer,
            "language": language,
            "question": messages[0],
            "split": split_of_answer(answer),
            "first_step_answer": True,
        },
    )
    if answer is not None:  # the checker's docs: the original types, not the hinted ones
        task.gold = [reference_calls(task, original)]
    return task


def _single_turn_tasks(root: Path, category: str, language_hints: bool) -> list[Task]:
    file = root / f"{PREFIX}_{category}.json"
    answer_file = root / "possible_answer" / f"{PREFIX}_{category}.json"
    answers: dict[str, Any] | None = None
    if answer_file.is_file():
        answers = {}
        for n, rec in read_jsonl(answer_file):
            answers[_get(rec, "id", str, answer_file, n)] = _get(rec, "ground_truth", list, answer_file, n)
    utils = bfcl_module("utils") if language_hints else None
    tasks = []
    for n, rec in read_jsonl(file):
        task_id = _get(rec, "id", str, file, n)
        if answers is not None and task_id not in answers:
            raise RecordError(file, n, "id", f"{task_id} has no possible answer in {answer_file}")
        tasks.append(_task(rec, None if answers is None else answers[task_id], category, (file, n), utils))
    return tasks


def load_single_turn(
    split: str = "all", path: str | None = None, categories: list[str] | None = None, language_hints: bool = True
) -> list[Task]:
    """Load BFCL-v4 single-turn categories.

    Args:
        split: ``train`` or ``test``, the declared split by called function (module docstring); ``all``:
            every item, the straddling ones and those without a possible answer included.
        path: a folder laid out like bfcl-eval's ``data/``; default: the installed wheel's.
        categories: a subset of :data:`SINGLE_TURN_CATEGORIES`; default: all of them (``train`` and
            ``test`` need categories with possible answers).
        language_hints: apply bfcl-eval's own doc pre-processing (the sentence naming the language;
            Java/JavaScript parameter types become ``string``), as its inference does.
    """
    if split not in SINGLE_TURN_SPLITS:
        raise ValueError(f"BFCL single-turn splits are {SINGLE_TURN_SPLITS}, got {split!r}")
    root = _data_dir(path)
    cats = _categories(categories, SINGLE_TURN_CATEGORIES)
    tasks = [t for c in cats for t in _single_turn_tasks(root, c, language_hints)]
    if split == "all":
        return tasks
    unsplit = sorted({t.category for t in tasks if t.extra["split"] is None})
    if unsplit:
        raise ValueError(f"BFCL single-turn categories {unsplit} call no function and have no {split!r} split; "
                         "use split 'all' or leave them out")  # fmt: skip
    return [t for t in tasks if t.extra["split"] == split]
