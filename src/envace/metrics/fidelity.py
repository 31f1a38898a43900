"""Rehearsal fidelity: how close a rehearsed tool response is to the real one (docs/design.md §5).

During validation the rollout runs a real environment in lockstep with the policy's rehearsals and
keeps one :class:`~envace.rollout.loop.FidelityPair` (call, rehearsed, real, benchmark) per call. The
pure functions here score one pair; :class:`FidelityMetrics` (a torchmetrics ``Metric``) averages
them with states that sum across processes; :class:`FidelityTracker` adds per-benchmark and
per-tool breakdowns created on first sight and synchronised by name.

Definitions, for a rehearsed response ``r`` and the real one ``g``:

==================  ==========================================================================
json_valid          ``r`` is not a rehearsal parse error (``EMPTY_OUTPUT``, ``NO_TAG``,
                    ``TAG_MALFORMED``, ``JSON_DECODE_ERROR``, ``INVALID_RESULT_TYPE``)
exact_match         canonical JSON of ``r`` equals that of ``g`` (sorted keys; ``1.0 == 1``)
key_f1              F1 over the sets of key paths (``"a.b"``, ``"a[].c"``) of ``r`` and ``g``
value_f1            F1 over the multisets of (path, canonical leaf value) of ``r`` and ``g``
error_agreement     both are errors or both succeed (error: a top-level ``"error"`` key)
decision_f1         ``value_f1`` over the leaves whose key is a decision field (:data:`DECISION_FIELDS`:
                    what a next call reuses or decides on, such as a SKU, a price, stock, an order id,
                    a status, an error code); two responses without such a leaf score 1.0
==================  ==========================================================================

A rehearsal that is not ``json_valid`` scores 0 on every other metric: the parser's error object
is not a prediction of the tool's behaviour (it would otherwise "agree" with any real error).
F1 edge cases: two empty sets score 1.0, one empty set 0.0. Lists are unordered for the F1s
(their items share the path ``a[]``) and ordered for ``exact_match``. Means are taken over all
pairs, invalid rehearsals included.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from torchmetrics import Metric

from envace.protocol import RehearsalError
from envace.types import JSON, FidelityPair, is_error

#: the keys whose values a next call reuses or decides on (ShopWorld's, and their common names elsewhere)
DECISION_FIELDS = frozenset({"sku", "price", "in_stock", "order_id", "status", "error", "id"})

PARSE_ERRORS = frozenset(
    {
        RehearsalError.EMPTY_OUTPUT,
        RehearsalError.NO_TAG,
        RehearsalError.TAG_MALFORMED,
        RehearsalError.JSON_DECODE,
        RehearsalError.INVALID_RESULT_TYPE,
    }
)


def _canon(value: JSON) -> JSON:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {str(k): _canon(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_canon(v) for v in value]
    return value


def canonical(value: JSON) -> str:
    """Canonical JSON text: sorted keys, no spaces, integral floats written as integers.

    >>> canonical({"b": [1.0, "x"], "a": None})
    '{"a":null,"b":[1,"x"]}'
    """
    return json.dumps(_canon(value), sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def json_valid(rehearsed: JSON) -> bool:
    """Whether a rehearsal met the output contract (it is not a rehearsal parse error).

    A structured error the policy *wrote* (a rehearsed tool failure) is valid.

    >>> json_valid({"files": ["a"]}), json_valid({"error": "no such file"})
    (True, True)
    >>> json_valid({"error": {"code": "NO_TAG", "message": "no <execution_result> tag"}})
    False
    """
    if not is_error(rehearsed):
        return True
    err = rehearsed["error"]
    return not (isinstance(err, dict) and err.get("code") in PARSE_ERRORS)


def exact_match(rehearsed: JSON, real: JSON) -> bool:
    """Canonical JSON equality (dict order and ``1`` vs ``1.0`` do not matter; list order does).

    >>> exact_match({"a": 1, "b": [2, 3]}, {"b": [2, 3], "a": 1.0}), exact_match([2, 3], [3, 2])
    (True, False)
    """
    return canonical(rehearsed) == canonical(real)


def key_paths(value: JSON, prefix: str = "") -> set[str]:
    """Every object key, as a dotted path; list items share the path ``<list>[]``.

    >>> sorted(key_paths({"a": {"b": 1}, "c": [{"d": 2}, {"e": 3}]}))
    ['a', 'a.b', 'c', 'c[].d', 'c[].e']
    >>> key_paths([1, 2]), sorted(key_paths([{"x": 1}]))
    (set(), ['[].x'])
    """
    out: set[str] = set()
    if isinstance(value, dict):
        for k, v in value.items():
            path = f"{prefix}.{k}" if prefix else str(k)
            out.add(path)
            out |= key_paths(v, path)
    elif isinstance(value, list | tuple):
        for item in value:
            out |= key_paths(item, prefix + "[]")
    return out


def leaf_values(value: JSON, prefix: str = "") -> Counter[tuple[str, str]]:
    """The multiset of (path, canonical value) over the leaves: scalars, empty objects and lists.

    >>> sorted(leaf_values({"a": [1, 1.0], "b": {}}).items())
    [(('a[]', '1'), 2), (('b', '{}'), 1)]
    """
    out: Counter[tuple[str, str]] = Counter()
    if isinstance(value, dict) and value:
        for k, v in value.items():
            out += leaf_values(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(value, list | tuple) and value:
        for item in value:
            out += leaf_values(item, prefix + "[]")
    else:
        out[(prefix, canonical(value))] += 1
    return out


def f1(predicted: Counter[Any], reference: Counter[Any]) -> float:
    """F1 of two multisets: ``2·|P ∩ R| / (|P| + |R|)``; 1.0 when both are empty.

    >>> f1(Counter("aab"), Counter("abc")), f1(Counter(), Counter()), f1(Counter(), Counter("a"))
    (0.6666666666666666, 1.0, 0.0)
    """
    total = sum(predicted.values()) + sum(reference.values())
    if total == 0:
        return 1.0
    return 2 * sum((predicted & reference).values()) / total


def key_set_f1(rehearsed: JSON, real: JSON) -> float:
    """F1 over the key paths of both responses (structure, values ignored).

    Rehearsed ``{"a": 1, "b": {"c": 2}}`` has paths {a, b, b.c}; real ``{"a": 5, "d": 0}`` has {a, d}:
    one shared path, so F1 = 2·1 / (3 + 2) = 0.4.

    >>> key_set_f1({"a": 1, "b": {"c": 2}}, {"a": 5, "d": 0})
    0.4
    >>> key_set_f1([1], [2, 3]), key_set_f1({}, {"a": 1})
    (1.0, 0.0)
    """
    return f1(Counter(key_paths(rehearsed)), Counter(key_paths(real)))


def leaf_value_f1(rehearsed: JSON, real: JSON) -> float:
    """F1 over the (path, value) leaves of both responses.

    Rehearsed ``{"files": ["a", "b"], "n": 2}`` has leaves {(files[], "a"), (files[], "b"), (n, 2)};
    real ``{"files": ["a", "c"], "n": 2.0}`` has {(files[], "a"), (files[], "c"), (n, 2)}: two shared,
    F1 = 2·2 / (3 + 3) = 2/3.

    >>> round(leaf_value_f1({"files": ["a", "b"], "n": 2}, {"files": ["a", "c"], "n": 2.0}), 4)
    0.6667
    """
    return f1(leaf_values(rehearsed), leaf_values(real))


def decision_f1(rehearsed: JSON, real: JSON) -> float:
    """F1 over the (path, value) leaves whose last key is a decision field (:data:`DECISION_FIELDS`):
    the facts a policy acts on, not the prose around them.

    >>> real = {"results": [{"sku": "K7Q2", "name": "red mug", "price": 4.5}]}
    >>> decision_f1({"results": [{"sku": "K7Q2", "name": "a red mug", "price": 4.5}]}, real)
    1.0
    >>> decision_f1({"results": [{"sku": "K7Q3", "name": "red mug", "price": 4.5}]}, real)
    0.5
    """

    def decisions(value: JSON) -> Counter[tuple[str, str]]:
        leaves = leaf_values(value)
        return Counter(
            {k: n for k, n in leaves.items() if k[0].rsplit(".", 1)[-1].removesuffix("[]") in DECISION_FIELDS}
        )

    return f1(decisions(rehearsed), decisions(real))


def error_agreement(rehearsed: JSON, real: JSON) -> bool:
    """Both responses are errors, or both succeed (an error has a top-level ``"error"`` key).

    >>> error_agreement({"error": "no such dir"}, {"error": "cd: folder not found"})
    True
    >>> error_agreement({"ok": True}, {"error": "denied"})
    False
    """
    return is_error(rehearsed) == is_error(real)


class FidelityScores(NamedTuple):
    """The six scores of one (rehearsed, real) pair, each in [0, 1]."""

    json_valid: float
    exact_match: float
    key_f1: float
    value_f1: float
    error_agreement: float
    decision_f1: float


NAMES: tuple[str, ...] = FidelityScores._fields


def score_pair(rehearsed: JSON, real: JSON) -> FidelityScores:
    """All six scores; an invalid rehearsal scores 0 on each.

    >>> score_pair({"a": 1}, {"a": 1})  # doctest: +NORMALIZE_WHITESPACE
    FidelityScores(json_valid=1.0, exact_match=1.0, key_f1=1.0, value_f1=1.0, error_agreement=1.0,
                   decision_f1=1.0)
    >>> score_pair({"error": {"code": "NO_TAG", "message": "m"}}, {"error": "x"})  # doctest: +NORMALIZE_WHITESPACE
    FidelityScores(json_valid=0.0, exact_match=0.0, key_f1=0.0, value_f1=0.0, error_agreement=0.0,
                   decision_f1=0.0)
    """
    if not json_valid(rehearsed):
        return FidelityScores(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    return FidelityScores(
        1.0,
        float(exact_match(rehearsed, real)),
        key_set_f1(rehearsed, real),
        leaf_value_f1(rehearsed, real),
        float(error_agreement(rehearsed, real)),
        decision_f1(rehearsed, real),
    )


class FidelityMetrics(Metric):
    """Mean fidelity scores over the pairs seen since the last ``reset()``.

    States are sums (one per score) and a pair count, all reduced with ``sum``, so ``compute()``
    returns the global means under DDP/FSDP. ``compute()`` gives ``fidelity/<score>`` (NaN when no
    pair was seen) and ``fidelity/pairs``.

    Args:
        prefix: the key prefix of the results.
        kwargs: passed to :class:`torchmetrics.Metric` (``sync_on_compute``, ``process_group``, ...).
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    sums: Tensor
    pairs: Tensor

    def __init__(self, prefix: str = "fidelity", **kwargs: Any):
        super().__init__(**kwargs)
        self.prefix = prefix
        self.add_state("sums", default=torch.zeros(len(NAMES)), dist_reduce_fx="sum")
        self.add_state("pairs", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, pairs: Sequence[FidelityPair]) -> None:
        """Add the scores of ``pairs``."""
        if not pairs:
            return
        scores = torch.tensor([score_pair(p.rehearsed, p.real) for p in pairs], dtype=self.sums.dtype)
        self.sums += scores.sum(0).to(self.sums.device)
        self.pairs += len(pairs)

    def compute(self) -> dict[str, Tensor]:
        means = self.sums / self.pairs if self.pairs > 0 else torch.full_like(self.sums, float("nan"))
        out = {f"{self.prefix}/{name}": means[i] for i, name in enumerate(NAMES)}
        out[f"{self.prefix}/pairs"] = self.pairs.clone()
        return out


def group_names(pair: FidelityPair) -> tuple[str, str]:
    """The breakdown groups of a pair: its benchmark and ``tool/<name>``."""
    return pair.benchmark, f"tool/{pair.call.name}"


class FidelityTracker(nn.Module):
    """Overall fidelity plus one :class:`FidelityMetrics` per benchmark and per tool.

    Keys: ``fidelity/<score>`` overall, ``fidelity/<score>/<benchmark>`` and
    ``fidelity/<score>/tool/<name>`` (e.g. ``fidelity/value_f1/bfcl``, ``fidelity/value_f1/tool/cd``).

    **How the lazily created metrics synchronise.** A group's metric is created when one of its
    pairs first arrives, so processes may hold different groups, and a collective that only some
    processes enter hangs. :meth:`compute` therefore first gathers the group names of every process
    (``all_gather_object``), creates the missing ones (empty) everywhere, and then computes every
    group in sorted name order: each process enters the same sum-reductions in the same order. It
    must be called on every process (as Lightning does in ``on_validation_epoch_end``).
    :meth:`reset` drops the groups, so an epoch reports only the tools it saw.

    Being an ``nn.Module``, the tracker moves with its LightningModule; new groups are created on
    the device of the overall metric.

    Args:
        kwargs: passed to every :class:`FidelityMetrics` (``sync_on_compute``, ``process_group``, ...).
    """

    def __init__(self, **kwargs: Any):
        super().__init__()
        self.metric_kwargs = kwargs
        self.overall = FidelityMetrics(**kwargs)
        self.groups = nn.ModuleDict()  # module keys cannot hold ".", tool names may: index them
        self.names: dict[str, str] = {}

    def group(self, name: str) -> FidelityMetrics:
        """The metric of group ``name``, created empty on first use."""
        if name not in self.names:
            key = f"g{len(self.names)}"
            metric = FidelityMetrics(**self.metric_kwargs).to(self.overall.device)
            metric.update([])  # counts as updated: computing an empty group raises no warning
            self.groups[key] = metric
            self.names[name] = key
        return self.groups[self.names[name]]  # type: ignore[return-value]

    def update(self, pairs: Sequence[FidelityPair]) -> None:
        """Add ``pairs`` to the overall metric and to their benchmark and tool groups."""
        self.overall.update(pairs)
        by_group: dict[str, list[FidelityPair]] = defaultdict(list)
        for pair in pairs:
            for name in group_names(pair):
                by_group[name].append(pair)
        for name, members in by_group.items():
            self.group(name).update(members)

    def _sync_names(self) -> None:
        dist = torch.distributed
        if not (self.overall.sync_on_compute and dist.is_available() and dist.is_initialized()):
            return
        group = self.overall.process_group
        gathered: list[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(gathered, sorted(self.names), group=group)
        for name in sorted({n for names in gathered for n in names}):
            self.group(name)

    def compute(self) -> dict[str, Tensor]:
        """All keys of the overall metric and of every group (call on every process)."""
        self._sync_names()
        out = dict(self.overall.compute())
        for name in sorted(self.names):
            for key, value in self.group(name).compute().items():
                out[f"{key}/{name}"] = value
        return out

    def reset(self) -> None:
        """Reset the overall metric and drop the groups."""
        self.overall.reset()
        self.groups = nn.ModuleDict()
        self.names = {}


def fidelity_table(pairs: Iterable[FidelityPair]) -> dict[str, float]:
    """Plain-float fidelity of a few pairs, with breakdowns (for reports, not for training logs)."""
    tracker = FidelityTracker(sync_on_compute=False)
    tracker.update(list(pairs))
    return {k: float(v) for k, v in tracker.compute().items()}
