"""Command-line entry points beyond ``fit``, each a module's ``main(argv)``; :data:`envace.cli.COMMANDS`
names them, and what every command shares.

* ``envace show`` (formerly ``envace rehearse``) — :func:`envace.commands.show.show` (``jsonargparse.CLI``):
  one task, the policy acting and rehearsing next to the real environment; transcript by role,
  side-by-side responses, fidelity, reward.
* ``envace export`` — :mod:`envace.commands.export` (jsonargparse, flags without values): a trained
  checkpoint's act or rehearse weights as a ``save_pretrained`` folder (LoRA merged, or adapters).
* ``envace serve-env`` — :mod:`envace.commands.serve_env` (``jsonargparse.CLI``): a trained policy's
  rehearse role served as an MCP server exposing the tools it learned (docs/own-tools.md).
* :mod:`~envace.commands.fit_config` — the LightningCLI of ``envace fit | validate``, and the one loader
  of a fit config (:func:`~envace.commands.fit_config.load_fit_config`: parsed as ``envace fit`` parses
  it, nothing built), through which every other command reads a fit config.
* :mod:`~envace.commands.errors` — a bad command line or config as one or two lines, with the nearest
  valid name (``did you mean``), for every command's parser.
* :mod:`~envace.commands.preflight` — files, model names and logger packages checked before anything
  is built; ``envace evaluate`` runs through it.
* :mod:`~envace.commands.usage` — ``envace --help``, the help of every nested hyperparameter group
  (``envace fit --model.policy.lora.help``), and the parser of the commands written as ``add_argument``
  calls (``export``, ``bench``, ``experiment``: jsonargparse, as every other command).
"""
