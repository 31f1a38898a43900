"""Plain functions as tools (a user's module: type hints and docstrings are the schema)."""

from __future__ import annotations


def word_count(text: str) -> dict:
    """Count the words of a text.

    Args:
        text: the text.
    """
    return {"words": len(text.split())}


def shout(text: str, times: int = 1) -> str:
    """The text in capitals, repeated.

    Args:
        text: what to shout.
        times: how many times.
    """
    return " ".join([text.upper()] * times)


def _helper() -> None:  # private: not a tool
    pass
