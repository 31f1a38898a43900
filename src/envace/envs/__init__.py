"""Real environments: build one from a Task, execute validated calls, snapshot the state."""

from envace.envs.base import Environment, make_environment

__all__ = ["Environment", "make_environment"]
