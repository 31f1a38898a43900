"""docs/metrics.md is the glossary of every key a fit writes: a smoke fit's event tags against it, the
custom-scalars layout against the tags, and the progress bar."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import NamedTuple

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.custom_scalar import layout_pb2

from envace.callbacks import FitProgressBar
from envace.metrics.fidelity import NAMES

GLOSSARY = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"
LAYOUT_TAG = "custom_scalars__config__"  # the Custom Scalars layout: configuration, not a metric
TEXT_SUFFIX = "/text_summary"  # add_text's tag suffix
PLACEHOLDERS = {
    "<benchmark>": r"[A-Za-z0-9_.-]+",
    "<role>": "(act|rehearse)",
    "<score>": f"({'|'.join(NAMES)})",
    "<tool>": ".+",
}


class Row(NamedTuple):
    key: str
    pattern: re.Pattern[str]
    only: bool  # written only when the row's condition happens


def glossary() -> list[Row]:
    """The rows of the ``## Keys`` tables: ``| `key` | meaning | unit | when |``."""
    text = GLOSSARY.read_text()
    keys = text[text.index("\n## Keys") : text.index("\n## Reading older runs")]
    rows = []
    for line in keys.splitlines():
        m = re.match(r"\| `([^`]+)` \|(.*)\|\s*$", line)
        if m:
            key, cells = m.group(1), m.group(2).split("|")
            assert len(cells) == 3, f"docs/metrics.md: {key}: a row has key, meaning, unit, when"
            pattern = re.escape(key)
            for name, regex in PLACEHOLDERS.items():
                pattern = pattern.replace(re.escape(name), regex)
            assert "<" not in pattern, f"docs/metrics.md: {key}: unknown placeholder"
            rows.append(Row(key, re.compile(pattern + "$"), "**only**" in cells[-1]))
    return rows


def event_tags(run_dir: Path) -> tuple[dict[str, list[int]], list[layout_pb2.Layout]]:
    """``{tag: steps}`` of every scalar and text tag in the run's events, and the layouts written."""
    tags: dict[str, list[int]] = {}
    layouts = []
    for f in sorted(run_dir.rglob("events.out.tfevents*")):
        acc = EventAccumulator(str(f), size_guidance={"scalars": 0, "tensors": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            tags.setdefault(tag, []).extend(e.step for e in acc.Scalars(tag))
        for tag in acc.Tags()["tensors"]:
            if tag == LAYOUT_TAG:
                layouts += [layout_pb2.Layout.FromString(e.tensor_proto.string_val[0]) for e in acc.Tensors(tag)]
            else:
                tags.setdefault(tag.removesuffix(TEXT_SUFFIX), []).extend(e.step for e in acc.Tensors(tag))
    return tags, layouts


def test_the_glossary_parses_and_names_every_fidelity_score() -> None:
    rows = glossary()
    assert len(rows) > 40 and len({r.key for r in rows}) == len(rows), "a key is listed twice"
    placeholders = GLOSSARY.read_text().split("## Placeholders")[1].split("## Keys")[0]
    assert all(f"`{name}`" in placeholders for name in NAMES)


@pytest.fixture(scope="module")
def run(smoke_fit: SimpleNamespace) -> SimpleNamespace:
    tags, layouts = event_tags(smoke_fit.dir)
    return SimpleNamespace(tags=tags, layouts=layouts, cli=smoke_fit.cli)


def test_every_logged_key_is_in_the_glossary_and_every_unmarked_key_is_logged(run: SimpleNamespace) -> None:
    rows = glossary()
    unknown = sorted(t for t in run.tags if not any(r.pattern.match(t) for r in rows))
    assert not unknown, f"logged but not in docs/metrics.md: {unknown}"
    missing = [r.key for r in rows if not r.only and not any(r.pattern.match(t) for t in run.tags)]
    assert not missing, f"in docs/metrics.md (not marked **only**) but not logged by the smoke fit: {missing}"
    assert "epoch" not in run.tags and "hp_metric" not in run.tags


def test_training_keys_are_written_once_at_their_step(run: SimpleNamespace) -> None:
    # smoke: steps 0-1 warm start, 2-3 RL; validation before training (step 0) and after step 4 (step 3)
    assert run.tags["train/sft/loss"] == [0, 1]  # not repeated through the RL steps
    assert run.tags["train/rl/loss"] == [2, 3] and run.tags["train/reward/all"] == [2, 3]
    assert run.tags["cost/act_tokens"] == [2, 3]
    assert run.tags["val/committed/official_success/all"] == [0, 3]
    assert run.tags["val/imagined/fidelity_gold/value_f1"] == [0, 3]
    assert run.tags["val/committed/transcript"] == [0, 3]


def test_the_custom_scalars_layout_opens_on_the_headline_curves(run: SimpleNamespace) -> None:
    assert len(run.layouts) == 1
    categories = run.layouts[0].category
    assert categories[0].title == "headline"
    first = [chart.multiline.tag for chart in categories[0].chart]
    assert first[0] == ["val/committed/official_success/"] and "fidelity_gold" in first[1][0]
    for category in categories:
        for chart in category.chart:
            if chart.title == "own-call rehearsal fidelity":
                continue  # the smoke fit's random policy makes no call: no own-call fidelity
            for regex in chart.multiline.tag:
                assert any(re.match(regex, t) for t in run.tags), f"{chart.title}: {regex} matches no logged tag"


def test_the_progress_bar_shows_phase_loss_and_reward(run: SimpleNamespace) -> None:
    trainer, module = run.cli.trainer, run.cli.model
    bar = trainer.progress_bar_callback
    assert isinstance(bar, FitProgressBar)
    items = bar.get_metrics(trainer, module)
    assert list(items) == ["phase", "loss", "reward"] and items["phase"] == "rl"
    assert [module.phase_at(s) for s in range(4)] == ["warm-start", "warm-start", "rl", "rl"]
