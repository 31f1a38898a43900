"""What each BFCL multi-turn tool reads and writes of its API class's state: static facts for the
env-free reward (:mod:`envace.rewards.bfcl`), derived offline and pinned.

The reward never executes anything (docs/design.md §3.5). It only needs facts about the API's code,
not about an episode:

* **reads / writes** — the instance attributes a call may look at before changing them (its inputs)
  and those it may change. Two calls on one instance *commute* (either order gives the same results
  and the same state) when neither writes what the other reads, and they do not both write an
  *observable* attribute (public, i.e. compared by bfcl-eval's state checker, or read by some tool).
  :func:`ordered` says whether the gold order of two tools matters, :func:`conflict` whether that of
  two calls does (:func:`call_effects`: the same facts per call, finer for the file system, whose
  calls act on the entries their arguments name).
* **non-idempotent** — repeating the call right after itself changes the public state again (a
  second order, tweet, booking, message, token), so a duplicate is not harmless.
* **overwrites** — a call that undoes what an earlier call of its tool wrote (a headlight, a login,
  the same doors) (:func:`overwrites`); **refused when repeated** — file-system calls that refuse
  their own repeat (:func:`refused_when_repeated`).

Reads, writes and idempotence are derived offline by ``scripts/make_bfcl_effects_table.py``, which
runs every gold call of the 800 BFCL multi-turn tasks in its real state with the instance's
attribute reads and writes recorded (see that script), and pinned in
:mod:`envace.rewards.bfcl_effects_table`. The tools no gold calls (the derivation never ran them) are
in :data:`UNCALLED`, read from their source. The rest is read from the API source here.
``tests/rewards/test_bfcl_effects.py`` re-derives both tables and checks every fact by execution in
the gold states: calls declared commuting commute, overwriting calls overwrite, refused repeats
change nothing.
"""

from __future__ import annotations

from functools import cache

from envace.rewards.bfcl_effects_table import EFFECTS, NON_IDEMPOTENT
from envace.types import ToolCall

Effects = tuple[frozenset[str], frozenset[str]]

#: tools of each API class that no gold call uses, so the derivation never ran them: ``(attributes
#: named, attributes assigned or mutated)`` from the method's source (``static_effects`` of
#: ``scripts/make_bfcl_effects_table.py``), a ``random.Random`` it draws from counted as written;
#: ``tests/rewards/test_bfcl_effects.py`` re-derives it and runs the argument-free ones.
UNCALLED: dict[str, dict[str, tuple[tuple[str, ...], tuple[str, ...]]]] = {
    "GorillaFileSystem": {"pwd": (("_current_dir", "root"), ())},
    "MathAPI": {
        t: ((), ())
        for t in ("absolute_value", "add", "divide", "imperial_si_conversion", "max_value", "min_value")
        + ("multiply", "percentage", "power", "round_number", "si_unit_conversion", "square_root")
        + ("subtract", "sum_values")
    },
    "MessageAPI": {
        "get_message_stats": (("current_user", "inbox"), ()),
        "list_users": (("user_map",), ()),
        "message_get_login_status": (("current_user",), ()),
        "search_messages": (("current_user", "inbox"), ()),
    },
    "TicketAPI": {
        "get_user_tickets": (("current_user", "ticket_queue"), ()),
        "logout": (("current_user",), ("current_user",)),
        "ticket_get_login_status": (("current_user",), ()),
    },
    "TradingBot": {
        "filter_stocks_by_price": (("stocks",), ()),
        "get_order_history": (("authenticated", "orders"), ()),
        "get_symbol_by_name": ((), ()),
        "get_transaction_history": (("authenticated", "long_context", "transaction_history"), ()),
        "notify_price_change": (("stocks",), ()),
        "trading_get_login_status": (("authenticated",), ()),
        "trading_login": (("authenticated",), ("authenticated",)),
    },
    "TravelAPI": {
        "get_all_credit_cards": (("credit_card_list",), ()),
        "get_booking_history": (("access_token", "booking_record", "token_expires_in"), ()),
        "get_budget_fiscal_year": ((), ()),
        "travel_get_login_status": (("token_expires_in",), ()),
    },
    "TwitterAPI": {
        "follow_user": (("authenticated", "following_list"), ("following_list",)),
        "get_tweet": (("tweets",), ()),
        "get_tweet_comments": (("comments", "tweets"), ()),
        "get_user_stats": (("following_list", "retweets", "tweets", "username"), ()),
        "get_user_tweets": (("tweets",), ()),
        "list_all_following": (("authenticated", "following_list"), ()),
        "posting_get_login_status": (("authenticated",), ()),
        "search_tweets": (("tweets",), ()),
        "unfollow_user": (("authenticated", "following_list"), ("following_list",)),
    },
    "VehicleControlAPI": {
        "adjustClimateControl": (
            ("acMode", "acTemperature", "fanSpeed", "humidityLevel"),
            ("acMode", "acTemperature", "fanSpeed"),
        ),
        "display_log": ((), ()),
        "get_current_speed": (("_random",), ("_random",)),
        "get_outside_temperature_from_weather_com": ((), ()),
        "releaseBrakePedal": (("_brakePedalForce", "brakePedalStatus"), ("_brakePedalForce", "brakePedalStatus")),
    },
}  # fmt: skip


def _known(class_name: str, tool: str) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    return EFFECTS.get(class_name, {}).get(tool) or UNCALLED.get(class_name, {}).get(tool)


@cache
def _observable(class_name: str) -> frozenset[str]:
    tools = [*EFFECTS.get(class_name, {}).values(), *UNCALLED.get(class_name, {}).values()]
    written = {a for _, w in tools for a in w}
    read = {a for r, _ in tools for a in r}
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
    known = _known(class_name, tool)
    return None if known is None else frozenset(known[0])


def writes(class_name: str, tool: str) -> frozenset[str] | None:
    """The attributes ``tool`` writes (``None``: unknown tool)."""
    known = _known(class_name, tool)
    return None if known is None else frozenset(known[1])


def non_idempotent(class_name: str, tool: str) -> bool:
    """Whether a repeat of the call changes the public state again (in some gold state)."""
    return tool in NON_IDEMPOTENT.get(class_name, ())


# --------------------------------------------------------------------------- per call

FS = "GorillaFileSystem"
#: file-system tools that act on named entries of the current directory, by argument: ``read`` the
#: whole entry (a file's text, a directory's children), ``seen`` only whether it exists and of what
#: kind, ``write`` the whole entry (create, remove, replace, add a child), ``text`` a file's text;
#: ``adds`` whether it may add an entry to a directory
_ENTRY_TOOLS: dict[str, dict[str, tuple[str, ...]]] = {
    "cat": {"read": ("file_name",)},
    "diff": {"read": ("file_name1", "file_name2")},
    "grep": {"read": ("file_name",)},
    "sort": {"read": ("file_name",)},
    "tail": {"read": ("file_name",)},
    "wc": {"read": ("file_name",)},
    "echo": {"seen": ("file_name",), "text": ("file_name",)},  # writes only a file that exists
    "rm": {"seen": ("file_name",), "write": ("file_name",)},
    "rmdir": {"read": ("dir_name",), "write": ("dir_name",)},  # only an empty one
    "mkdir": {"seen": ("dir_name",), "write": ("dir_name",), "adds": ()},
    "touch": {"seen": ("file_name",), "write": ("file_name",), "adds": ()},
    "cp": {"read": ("source",), "seen": ("destination",), "write": ("destination",), "adds": ()},
    "mv": {"read": ("source", "destination"), "write": ("source", "destination"), "adds": ()},
}
#: file-system tools that, once called, refuse the same call (and write nothing) until an entry they
#: look at changes: the directory or file exists now, the removed or moved entry is gone
_REFUSED_WHEN_REPEATED = frozenset({"mkdir", "touch", "rm", "rmdir", "mv"})
_KEY = {"read": "root/{}", "seen": "root/{}?", "write": "root/{}", "text": "root/{}:text"}


def _entry_effects(call: ToolCall) -> Effects | None:
    """A file-system call's keys: ``root/<name>`` for an entry of the current directory (with all
    below it), ``root/<name>?`` for whether it exists (and is a file or a directory),
    ``root/<name>:text`` for a file's text, ``root+`` for the order in which entries were added
    (``ls`` and ``find`` list them in that order), ``_current_dir`` for the directory the names are
    relative to; ``None`` for a call that names no entries or names them with values that are not
    strings."""
    spec = _ENTRY_TOOLS.get(call.name)
    if spec is None:
        return None
    if call.name == "echo" and not call.arguments.get("file_name"):
        return frozenset(), frozenset()  # printed to the terminal: touches nothing
    names = {a: call.arguments.get(a) for args in spec.values() for a in args}
    if not all(isinstance(v, str) for v in names.values()):
        return None
    keys = {role: {_KEY[role].format(names[a]) for a in spec.get(role, ())} for role in _KEY}
    written = keys["write"] | keys["text"] | ({"root+"} if "adds" in spec else set())
    return frozenset({"_current_dir"} | keys["read"] | keys["seen"]), frozenset(written)


def refused_when_repeated(class_name: str, tool: str) -> bool:
    """Whether a repeat of the call, with nothing in between changing what it reads, is refused and
    writes nothing (``mkdir``, ``touch``, ``rm``, ``rmdir``, ``mv``): then what it would write does
    not matter to whether the repeat changes anything."""
    return class_name == FS and tool in _REFUSED_WHEN_REPEATED


def call_effects(class_name: str, call: ToolCall) -> Effects | None:
    """``(reads, writes)`` of one call, as the table gives them for its tool (``None``: unknown tool).

    The file system keeps its whole tree in one attribute (``root``), so by the table any two calls
    that change files conflict. Its tools only act on entries of the current directory named by their
    arguments (no paths), so a call on named entries gets keys for those entries instead
    (:func:`_entry_effects`); ``root`` itself stays for the tools that read every entry (``ls``,
    ``find``, ``du``, ``cd``, ``pwd``), and :func:`meets` lets it meet every ``root/...`` key.

    >>> sorted(call_effects(FS, ToolCall("rm", {"file_name": "a.txt"}))[1])
    ['root/a.txt']
    >>> call_effects("TradingBot", ToolCall("get_stock_info", {"symbol": "X"}))[1]
    frozenset()
    """
    if class_name == FS:
        entries = _entry_effects(call)
        if entries is not None:
            return entries
        if call.name == "ls":  # the recorder saw only the pointer: it lists every entry, in order
            return frozenset({"_current_dir", "root"}), frozenset()
    known = _known(class_name, call.name)
    return None if known is None else (frozenset(known[0]), frozenset(known[1]))


def meets(xs: frozenset[str], ys: frozenset[str]) -> bool:
    """Whether two key sets share state: a common key, or a key and one below it (``root`` and
    ``root/a.txt`` or ``root+``; ``root/a.txt`` and ``root/a.txt:text``)."""
    if xs & ys:
        return True
    return any(y.startswith(_below(x)) or x.startswith(_below(y)) for x in xs for y in ys)


def _below(key: str) -> tuple[str, ...]:
    return tuple(key + sep for sep in "/+?:")


def observable(class_name: str, key: str) -> bool:
    """Whether a written key can matter to the official checker: public (its state check compares it)
    or read by some tool (a later call's result or effect can show it)."""
    return public(key) or key in _observable(class_name)


def public(key: str) -> bool:
    """Whether bfcl-eval's state checker compares the attribute (it skips names starting with ``_``)."""
    return not key.startswith("_")


def conflict(class_name: str, a: ToolCall, b: ToolCall) -> bool:
    """Whether two calls on one instance of ``class_name`` may give other results or another state
    when swapped (True when either tool is unknown): one writes what the other reads, or both write
    the same observable state.

    >>> rm = lambda f: ToolCall("rm", {"file_name": f})
    >>> conflict(FS, rm("a"), rm("b")), conflict(FS, rm("a"), rm("a")), conflict(FS, rm("a"), ToolCall("ls"))
    (False, True, True)
    >>> touch = lambda f: ToolCall("touch", {"file_name": f})
    >>> conflict(FS, touch("a"), touch("b"))  # both add an entry: a later ls lists them in that order
    True
    """
    ea, eb = call_effects(class_name, a), call_effects(class_name, b)
    if ea is None or eb is None:
        return True
    (ra, wa), (rb, wb) = ea, eb
    shared = frozenset(k for k in wa if observable(class_name, k))
    return meets(wa, rb) or meets(wb, ra) or meets(shared, frozenset(k for k in wb if observable(class_name, k)))


#: tools whose successful call sets every attribute it writes from its arguments (and from state no
#: call of the same tool writes), so that it leaves the state as if an earlier call of the same tool had
#: not run; ``lockDoors`` only for doors it names too, ``echo`` only for the same file
_OVERWRITING = {
    "VehicleControlAPI": {"setHeadlights", "set_navigation", "pressBrakePedal", "activateParkingBrake", "lockDoors"},
    "MessageAPI": {"message_login"},
    "TicketAPI": {"ticket_login"},
    "TravelAPI": {"set_budget_limit"},
    "GorillaFileSystem": {"echo"},
}


def overwrites(class_name: str, earlier: ToolCall, later: ToolCall) -> bool:
    """Whether ``later``, when it succeeds, undoes whatever ``earlier`` wrote (same tool, and one of
    :data:`_OVERWRITING`): a headlight, a destination, a login replaced; the same doors locked or
    unlocked; the same file written. ``tests/rewards/test_bfcl_effects.py`` runs every gold call of
    these tools after other calls of the tool, in its gold state.

    >>> lock = lambda u, d: ToolCall("lockDoors", {"unlock": u, "door": d})
    >>> overwrites("VehicleControlAPI", lock(True, ["driver"]), lock(False, ["driver", "passenger"]))
    True
    >>> overwrites("VehicleControlAPI", lock(True, ["driver", "passenger"]), lock(False, ["driver"]))
    False
    """
    if earlier.name != later.name or later.name not in _OVERWRITING.get(class_name, ()):
        return False
    if later.name == "lockDoors":
        doors, covered = earlier.arguments.get("door"), later.arguments.get("door")
        return isinstance(doors, list) and isinstance(covered, list) and set(map(str, doors)) <= set(map(str, covered))
    if later.name == "echo":
        name = later.arguments.get("file_name")
        return isinstance(name, str) and bool(name) and earlier.arguments.get("file_name") == name
    return True
