"""The ShopWorld study's declarations: hypotheses.yaml loads through the judge's parser and says what
rules.yaml says in words (the margin, the precondition, the control stratum, the strata by task id)."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import yaml

from envace.data.sources import load_source
from envace.experiment import judge

STUDY = Path(__file__).resolve().parents[2] / "studies" / "shopworld"


def test_the_hypotheses_parse_and_agree_with_the_rules() -> None:
    rules = yaml.safe_load((STUDY / "rules.yaml").read_text())
    declared = {h.name: h for h in judge.parse(judge.load(str(STUDY / "hypotheses.yaml")))}
    assert set(declared) == {"sanity", "H1", "H2", "H3", "H4"} and set(rules["hypotheses"]) - {"control"} <= set(
        declared
    )
    h1 = declared["H1"]
    assert h1.rule == "non_inferiority" and h1.margin == 0.05 and "-0.05" in rules["hypotheses"]["H1"]
    assert h1.precondition is not None and h1.precondition["at_least"] == 0.10 and "0.10" in rules["hypotheses"]["H1"]
    assert [c.where["task"] for c in h1.controls] == ["*S5_control*"] and list(h1.zero_env_calls) == ["envace"]
    assert declared["H3"].compare[0].metric == "decision_f1" and declared["H3"].margin == 0.02


def test_the_stratum_patterns_select_the_strata_they_name() -> None:
    ids = [t.id for t in load_source("shopworld", split="test")]
    assert len(fnmatch.filter(ids, "*S[1-4]_*")) == 400 and len(fnmatch.filter(ids, "*S5_control*")) == 100
