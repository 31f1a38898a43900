"""Command-line entry points beyond ``fit``, each a module's ``main(argv)``; :data:`envace.cli.COMMANDS`
names them.

* ``envace show`` (formerly ``envace rehearse``) — :func:`envace.commands.show.show` (``jsonargparse.CLI``):
  one task, the policy acting and rehearsing next to the real environment; transcript by role,
  side-by-side responses, fidelity, reward.
* ``envace export`` — :mod:`envace.commands.export` (argparse: flags without values): a trained
  checkpoint's act or rehearse weights as a ``save_pretrained`` folder (LoRA merged, or adapters).
"""
