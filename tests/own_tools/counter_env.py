"""A TRL ``environment_factory``-shaped class, as TRL's docs write one: ``reset(**row)`` starts an
episode and returns the first user message; public methods are the tools; ``get_reward()``."""

from __future__ import annotations


class CounterEnv:
    def __init__(self) -> None:
        self.count = 0
        self.target = 0

    def reset(self, target: int = 3, **kwargs) -> str:
        self.count = 0
        self.target = target
        return f"Increment the counter until it reaches {target}."

    def increment(self, by: int) -> str:
        """Add to the counter.

        Args:
            by: how much to add.
        """
        self.count += by
        return f"The counter is now {self.count}."

    def read(self) -> int:
        """The counter's value."""
        return self.count

    def get_reward(self) -> float:
        return 1.0 if self.count == self.target else 0.0
