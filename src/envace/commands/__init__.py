"""Command-line entry points beyond ``fit``: each is a function with typed, documented parameters
wrapped by ``jsonargparse.CLI`` in its module's ``main(argv)``.

* ``envace rehearse`` — :func:`envace.commands.rehearse.rehearse`: one task, the policy acting and
  rehearsing next to the real environment; transcript by role, side-by-side responses, fidelity, reward.
"""

COMMANDS: dict[str, str] = {"rehearse": "envace.commands.rehearse:main"}

__all__ = ["COMMANDS"]
