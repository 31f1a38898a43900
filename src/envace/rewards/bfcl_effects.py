"""What each BFCL multi-turn tool reads and writes of its API class's state: static facts for the
env-free reward (:mod:`envace.rewards.bfcl`), derived offline and pinned.

The reward never executes anything (docs/design.md §3.5). It only needs two facts per tool, which are
properties of the API's code, not of an episode:

* **reads / writes** — the instance attributes a call may look at before changing them (its inputs)
  and those it may change. Two calls on one instance *commute* (either order gives the same results
  and the same state) when neither writes what the other reads, and they do not both write an
  *observable* attribute (public, i.e. compared by bfcl-eval's state checker, or read by some tool).
  :func:`ordered` says whether the gold order of two calls matters.
* **non-idempotent** — repeating the call right after itself changes the public state again (a
  second order, tweet, booking, message, token), so a duplicate is not harmless.

Both are derived offline by ``scripts/make_bfcl_effects_table.py``, which runs every gold call of the
800 BFCL multi-turn tasks in its real state with the instance's attribute reads and writes recorded
(see that script), and pinned in :mod:`envace.rewards.bfcl_effects_table`;
``tests/rewards/test_bfcl_effects.py`` re-derives the table and checks, by execution, that pairs
declared commuting do commute.
"""

from __future__ import annotations

from functools import cache

from envace.rewards.bfcl_effects_table import EFFECTS, NON_IDEMPOTENT


@cache
def _observable(class_name: str) -> frozenset[str]:
    tools = EFFECTS.get(class_name, {})
    written = {a for _, w in tools.values() for a in w}
    read = {a for r, _ in tools.values() for a in r}
    return frozenset({a for a in written if not a.startswith("_")} | (read & written))


def ordered(class_name: str, a: str, b: str) -> bool:
    """Whether calls of tools ``a`` and ``b`` on one instance of ``class_name`` may give other results
    or another state when swapped (True for a tool the table does not know).

    >>> ordered("TravelAPI", "get_flight_cost", "set_budget_limit"), ordered("GorillaFileSystem", "cd", "ls")
    (False, True)
    """
    tools = EFFECTS.get(class_name, {})
    if a not in tools or b not in tools:
        return True
    (ra, wa), (rb, wb) = tools[a], tools[b]
    return bool(set(wa) & set(rb) or set(wb) & set(ra) or set(wa) & set(wb) & _observable(class_name))


def reads(class_name: str, tool: str) -> frozenset[str] | None:
    """The attributes ``tool`` reads (``None``: unknown tool)."""
    known = EFFECTS.get(class_name, {}).get(tool)
    return None if known is None else frozenset(known[0])


def writes(class_name: str, tool: str) -> frozenset[str] | None:
    """The attributes ``tool`` writes (``None``: unknown tool)."""
    known = EFFECTS.get(class_name, {}).get(tool)
    return None if known is None else frozenset(known[1])


def non_idempotent(class_name: str, tool: str) -> bool:
    """Whether a repeat of the call changes the public state again (in some gold state)."""
    return tool in NON_IDEMPOTENT.get(class_name, ())
