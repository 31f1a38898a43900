"""Command-line entry points beyond ``fit``: each is a function with typed, documented parameters
wrapped by ``jsonargparse.CLI`` in its module's ``main(argv)``; :data:`envace.cli.COMMANDS` names them.

* ``envace show`` (formerly ``envace rehearse``) — :func:`envace.commands.show.show`: one task, the
  policy acting and rehearsing next to the real environment; transcript by role, side-by-side
  responses, fidelity, reward.
"""
