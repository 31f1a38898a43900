"""``envace evaluate`` (:func:`envace.evaluation.evaluate`): the command line parsed, ``--policy`` and
``--simulator`` checked before any model is loaded (:mod:`envace.commands.preflight`), and for your own
tasks (``--benchmark tasks``) the fit config of ``--tasks.path`` read as ``envace fit`` reads it
(:func:`envace.commands.fit_config.fit_source`)."""

from __future__ import annotations

from envace.commands.fit_config import fit_source
from envace.commands.preflight import check_model_source, check_vllm


def main(argv: list[str]) -> int:
    """Entry point of ``envace evaluate``."""
    from envace.evaluation.policies import REFERENCE_POLICIES
    from envace.evaluation.run import evaluate, parse

    kwargs = parse(argv)
    if kwargs["benchmark"] == "tasks":
        kwargs["source"] = fit_source(kwargs["tasks"].path if kwargs["tasks"] else None)
    check_model_source(str(kwargs["policy"]), "--policy", references=tuple(REFERENCE_POLICIES))
    if kwargs.get("simulator"):
        check_model_source(str(kwargs["simulator"]), "--simulator")
    check_vllm(kwargs.get("sampling"))
    evaluate(**kwargs)
    return 0
