"""Keys and values kept between the engine's calls, so that no prompt's known part is run again.

* the **shared prefix** (the system turn with its tool block, identical across a group's episodes)
  is prefilled once per rollout and expanded to every row;
* each **row's own** keys and values (its prompt and what it generated) are kept when it ends, so
  the same episode's next generation prefills only the tokens appended since, not its whole history.

Both are forgotten whenever the weights change (:meth:`KeptKV.clear`, from ``reset_cache``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from envace.rollout.engine.kv import KV, Part
from envace.rollout.engine.sampling import SamplingConfig

PREFIXES = 8  # most shared prefixes kept (the oldest goes first)


def shared_length(prompts: list[list[int]], sampling: SamplingConfig) -> int:
    """Length of the common prefix worth caching (0 when sharing is off or it is too short).

    At least one token of each prompt stays uncached, so every row produces next-token logits.
    """
    if not sampling.share_prefix:
        return 0
    first, n = prompts[0], min(len(p) for p in prompts) - 1
    for p in prompts[1:]:
        n = next((i for i in range(n) if p[i] != first[i]), n)
    return n if n >= sampling.min_prefix else 0


@dataclass
class KeptKV:
    """The shared prefixes' and the ended rows' keys and values (``[1, ...]`` per layer), by their ids.

    ``rows`` is least recently kept first, within ``SamplingConfig.row_cache_tokens`` (:meth:`keep`).
    """

    prefixes: dict[tuple[int, ...], KV] = field(default_factory=dict)
    rows: OrderedDict[tuple[int, ...], KV] = field(default_factory=OrderedDict)

    def clear(self) -> None:
        self.prefixes.clear()
        self.rows.clear()

    def parts(
        self, prompts: list[list[int]], sampling: SamplingConfig, prefill: Callable[[tuple[int, ...]], KV]
    ) -> list[Part]:
        """Per prompt, ``(cached ids, their keys and values)`` or ``None``: the longest kept row or
        prefix that starts it, else the prefix that two or more prompts without one share
        (``prefill(prefix)`` computes its keys and values on first use). A kept row that a prompt
        extends is dropped: the longer row will replace it when this call ends."""
        parts: list[Part] = [self.hit(p, sampling) for p in prompts]
        missing = [p for p, hit in zip(prompts, parts, strict=True) if hit is None]
        shared = shared_length(missing, sampling) if len(missing) > 1 else 0
        if shared:
            prefix = tuple(missing[0][:shared])
            kv = self.prefix(prefix, prefill)
            parts = [hit if hit is not None else (prefix, kv) for hit in parts]
        for key in {h[0] for h in parts if h is not None and h[0] in self.rows}:
            self.rows.pop(key)
        return parts

    def hit(self, prompt: list[int], sampling: SamplingConfig) -> Part:
        """The longest kept row (with ``sampling.reuse_rows``) or prefix that is a proper prefix of ``prompt``."""
        best: Part = None
        for store in (self.rows, self.prefixes) if sampling.reuse_rows else (self.prefixes,):
            for key, kv in store.items():
                n = len(key)
                longer = n < len(prompt) and (best is None or n > len(best[0]))
                if longer and prompt[n - 1] == key[-1] and tuple(prompt[:n]) == key:
                    best = (key, kv)
        return best

    def prefix(self, ids: tuple[int, ...], prefill: Callable[[tuple[int, ...]], KV]) -> KV:
        """The keys and values of the shared prefix ``ids``, from ``prefill(ids)`` on first use."""
        if ids not in self.prefixes:
            if len(self.prefixes) >= PREFIXES:
                self.prefixes.pop(next(iter(self.prefixes)))
            self.prefixes[ids] = prefill(ids)
        return self.prefixes[ids]

    def keep(self, ids: tuple[int, ...], kv: KV, budget: int) -> None:
        """Keep an ended row's keys and values; the least recently kept rows go while the rows hold
        more than ``budget`` tokens."""
        self.rows[ids] = kv
        total = sum(len(k) for k in self.rows)
        while total > budget and self.rows:
            total -= len(self.rows.popitem(last=False)[0])
