"""Bad command lines in one or two lines: what is wrong, and the nearest valid name (:mod:`difflib`).

argparse and jsonargparse answer a bad command line by printing the command's whole usage (70 lines
for ``envace fit``) and the one line that matters last; an unknown key deep in a config comes as a
20-line report of every type the value did not match. Inside :func:`usage_errors` (what
:func:`envace.cli.main` runs every command in) the parsers raise :class:`UsageError` instead, with
the message condensed to the key and the reason, and a ``did you mean`` when a known name is close:

>>> condense("unrecognized arguments: --trainer.max_stepz 3", ["--trainer.max_steps", "--config"])
"unknown option '--trainer.max_stepz'; did you mean '--trainer.max_steps'?"
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib
import inspect
import re
import typing
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

from envace.types import UsageError  # defined with the shared records: the data layer raises it too


# --- nearest names ------------------------------------------------------------------------------
def nearest(word: str, choices: Iterable[str]) -> str | None:
    """The choice closest to ``word``, when one is close enough (:func:`difflib.get_close_matches`).

    >>> nearest("evaluat", ["fit", "evaluate", "export"])
    'evaluate'
    >>> nearest("zzz", ["fit", "export"]) is None
    True
    """
    found = difflib.get_close_matches(word, sorted(set(choices)), n=1, cutoff=0.6)
    return found[0] if found else None


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the nearest choice, or ``""``."""
    best = nearest(word, choices)
    return f"; did you mean {best!r}?" if best else ""


def fix_key(key: str, known: Iterable[str]) -> str | None:
    """``key`` (dotted) with its first unknown part replaced by the nearest known one at that level.

    >>> fix_key("trainr.logger.init_args.save_dir", ["trainer.logger", "model", "data.limit"])
    'trainer.logger.init_args.save_dir'
    >>> fix_key("data.limt", ["trainer.logger", "data.limit"])
    'data.limit'
    """
    known = set(known)
    parts = key.split(".")
    for i, part in enumerate(parts):
        prefix = ".".join(parts[:i])
        below = [k[len(prefix) + 1 :] if prefix else k for k in known if not prefix or k.startswith(prefix + ".")]
        children = {k.split(".")[0] for k in below}
        if part not in children:
            best = nearest(part, children)
            return ".".join([*parts[:i], best, *parts[i + 1 :]]) if best else None
    return None


def unknown_key(key: str, known: Iterable[str], dashes: str = "") -> str:
    """``unknown option '--key'`` (or ``unknown key``), with the nearest known key."""
    fixed = fix_key(key, known)
    what = "option" if dashes else "key"
    return f"unknown {what} '{dashes}{key}'" + (f"; did you mean '{dashes}{fixed}'?" if fixed else "")


def init_parameters(cls: type) -> dict[str, Any]:
    """The keyword arguments of ``cls`` (a dataclass's fields; a class's ``__init__``, following
    ``**kwargs`` up to the parent's), each with its type hint (``Any`` when it does not resolve)."""
    if dataclasses.is_dataclass(cls):
        return {f.name: _hints(cls).get(f.name, Any) for f in dataclasses.fields(cls) if f.init}
    params: dict[str, Any] = {}
    for klass in cls.__mro__:
        if "__init__" not in vars(klass) or klass is object:
            continue
        init = vars(klass)["__init__"]
        hints = _hints(init)
        sig = list(inspect.signature(init).parameters.values())[1:]
        named = (p for p in sig if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
        params.update({p.name: hints.get(p.name, Any) for p in named if p.name not in params})
        if not any(p.kind is p.VAR_KEYWORD for p in sig):
            break
    return params


def _hints(obj: Any) -> dict[str, Any]:
    try:
        return typing.get_type_hints(obj)
    except Exception:  # an annotation that names what is only imported for type checking
        return {}


def import_class(path: str) -> type | None:
    """The class at the dotted ``path``, or ``None``."""
    module, _, name = path.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), name) if module else None
    except (ImportError, AttributeError, ValueError):
        return None
    return found if isinstance(found, type) else None


# --- condensing a parser's message --------------------------------------------------------------
#: lines of jsonargparse's union report that carry no reason of their own
_STRUCTURE = re.compile(
    r"Does not validate against any|Subtypes: |Errors:|Given value|Expected a <class 'NoneType'>|Not a valid subclass"
)
_KEY = re.compile(r'Parser key "([^"]+)":')
_CLASS = re.compile(r"Problem with given class_path '([^']+)':")


def _reason(message: str) -> tuple[list[str], str | None, str]:
    """The keys leading to the first reason in a nested jsonargparse report, the innermost class, and
    the reason itself."""
    stack: list[tuple[int, str, str]] = []
    for raw in message.splitlines():
        text = raw.strip().removeprefix("- ")
        if not text:
            continue
        indent = len(raw) - len(raw.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        found = _KEY.match(text) or _CLASS.match(text)
        if found:  # a level of the report; a reason may follow on the same line
            stack.append((indent, "key" if found.re is _KEY else "class", found.group(1)))
            text = text[found.end() :].strip()
        if text and not _STRUCTURE.match(text):
            classes = [v for _, kind, v in stack if kind == "class"]
            return [v for _, kind, v in stack if kind == "key"], classes[-1] if classes else None, text
    return [], None, message.strip()


def condense(message: str, options: Iterable[str]) -> str:
    """A parser's error ``message`` as one line; ``options``: the option strings it accepts."""
    options = list(options)
    keys = {o.lstrip("-") for o in options if o.startswith("--")}
    unrecognized = re.match(r"unrecognized arguments: (\S+)", message)
    if unrecognized:
        return unknown_key(unrecognized.group(1).lstrip("-").split("=")[0], keys, dashes="--")
    refused = re.match(r"(?:Subcommand '\w+'|Group '[\w.]+') does not accept (?:option|nested key) '([^']+)'", message)
    if refused:
        return unknown_key(refused.group(1), keys)
    choice = re.match(r"argument (\S+): invalid choice: '([^']*)' \(choose from (.*)\)", message)
    if choice:
        choices = [c.strip(" '\"") for c in choice.group(3).split(",")]
        arg = "command" if choice.group(1) == "subcommand" else choice.group(1)
        return f"{arg}: invalid choice {choice.group(2)!r} (choose from {', '.join(choices)})" + did_you_mean(
            choice.group(2), choices
        )
    path, cls, reason = _reason(message)
    option = re.match(r"Option '([^']+)' is not accepted", reason)
    klass = import_class(cls) if cls else None
    if option and klass is not None:
        return unknown_key(".".join([*path, option.group(1)]), [".".join([*path, p]) for p in init_parameters(klass)])
    if path == ["config"]:
        return f"--config: {reason}"
    return f"{'.'.join(path)}: {reason}" if path else reason


def option_strings(parser: argparse.ArgumentParser) -> Iterator[str]:
    """The option strings of ``parser`` and of its subcommands' parsers."""
    for action in parser._actions:
        yield from action.option_strings
        for sub in (getattr(action, "_name_parser_map", None) or {}).values():
            yield from option_strings(sub)


@contextmanager
def usage_errors() -> Iterator[None]:
    """Within the block, a parser that would print its usage and exit raises :class:`UsageError`.

    The standard library's and jsonargparse's ``ArgumentParser.error`` are the one place both report
    a bad command line; parsers built with ``exit_on_error=False`` (jsonargparse's own, trying each
    type of a union) keep raising ``ArgumentError`` as before.
    """
    import jsonargparse

    plain, nested = argparse.ArgumentParser.error, jsonargparse.ArgumentParser.error

    def plain_error(self: argparse.ArgumentParser, message: str) -> NoReturn:
        if not self.exit_on_error:
            plain(self, message)
        raise _usage_error(self, message)

    def nested_error(self: Any, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error:
            nested(self, message, ex)
        raise _usage_error(getattr(ex, "subcommand_parser", None) or self, message)

    argparse.ArgumentParser.error = plain_error  # type: ignore[method-assign,assignment]
    jsonargparse.ArgumentParser.error = nested_error  # type: ignore[method-assign]
    try:
        yield
    finally:
        argparse.ArgumentParser.error = plain  # type: ignore[method-assign]
        jsonargparse.ArgumentParser.error = nested  # type: ignore[method-assign]


def _usage_error(parser: argparse.ArgumentParser, message: str) -> UsageError:
    """``message`` of ``parser`` condensed; where it names no valid choice, how to list them."""
    line = condense(message, option_strings(parser))
    prog = parser.prog.replace(" [options]", "")
    return UsageError(line, hint=f"`{prog} --help` lists the options" if "did you mean" not in line else None)
