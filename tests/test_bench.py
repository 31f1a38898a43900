"""``envace bench --quick``: one JSON object with every figure, measured on the tiny model."""

from __future__ import annotations

import importlib.util
import json

import pytest

from envace import hardware
from envace.bench import main, parse_args
from envace.bench.layout import call_row_ends, generation_spans, prefill_tokens


@pytest.fixture(scope="module")
def report() -> dict:
    from contextlib import redirect_stdout
    from io import StringIO

    out = StringIO()
    with redirect_stdout(out):
        assert main(["--quick"]) == 0
    return json.loads(out.getvalue())  # exactly one JSON object, nothing else on stdout


def test_quick_bench_reports_every_figure(report: dict) -> None:
    assert report["quick"] and report["model"] == "tiny"
    assert report["peak"]["fp32_gflops"] > 0 and report["peak"]["bf16_gflops"] > 0
    assert report["peak"]["threads"] == 2
    native = hardware.native_bf16()  # bf16 figures only where the CPU computes bf16 (ENVACE_BF16 forces it)
    machine = report["machine"]
    assert machine["capability"]["cpu_bf16"] is native is report["peak"]["bf16_native"]
    assert machine["chosen"] == {"trainer.precision": "bf16-mixed" if native else "32-true",
                                 "sampling.dtype": "bfloat16" if native else "float32"}  # fmt: skip

    runs = {(r["tokens"], r["dtype"]): r for r in report["training"]["runs"]}
    dtypes = ("fp32", "bf16") if native else ("fp32",)
    assert set(runs) == {(n, d) for n in (64, 128) for d in dtypes}
    for r in runs.values():
        assert r["tokens_per_s"] > 0 and r["mfu"] > 0 and 0 < r["loss_positions"] < r["tokens"]
    assert "mfu_vs_run_peak" in runs[64, "fp32"]
    assert native is ((64, "bf16") in runs and "mfu_vs_bf16_peak" in runs[64, "bf16"])
    assert report["training"]["optimizer_step_seconds"] > 0
    plain = report["training"]["plain_transformers"]
    assert plain["tokens"] == 64 and plain["mfu"] > 0 and "mfu_vs_run_peak" in plain

    ro = report["rollout"]
    if not native:
        assert "skipped" in ro["bf16_sampling"]
    for weights in ("policy_weights", "bf16_sampling") if native else ("policy_weights",):
        for role in ("act", "rehearse"):
            for mode in ("batched", "sequential"):
                assert ro[weights][role][mode]["tokens"] > 0 and ro[weights][role][mode]["tokens_per_s"] > 0
            assert ro[weights][role]["speedup"] > 0
            assert ro[weights][role]["sequential"]["tokens_per_step"] == 1.0  # one row: one token per forward
        assert ro[weights]["both_roles_speedup"] > 0
    for role in ("act", "rehearse"):  # the same work on both sides (fp32: bf16 rounding can flip draws)
        assert ro["policy_weights"][role]["identical_episodes"] == ro["group_size"]
    act, rehearse = ro["policy_weights"]["act"]["batched"], ro["policy_weights"]["rehearse"]["batched"]
    assert act["role_tokens"]["rehearse"] == 0  # act run: every generated token is an act token
    assert rehearse["role_tokens"]["rehearse"] == rehearse["tokens"]  # and here a rehearse token
    assert ro["row_reuse"]["without"]["prefill_tokens"] >= rehearse["prefill_tokens"]
    assert ro["identical_prompts"]["without"]["prefill_tokens"] >= rehearse["prefill_tokens"]
    assert not native or set(ro["bf16_sampling"]["gain_batched"]) == {"act", "rehearse"}
    for role in ("act", "rehearse"):  # lockstep: the same tokens, in at least as many forwards
        lockstep, continuous = ro["continuous"][role]["lockstep"], ro["policy_weights"][role]["batched"]
        assert lockstep["tokens"] == continuous["tokens"] and lockstep["decode_steps"] >= continuous["decode_steps"]

    layout = report["layout"]
    mean = layout["mean_tokens_per_episode"]
    assert mean["inline"] < mean["per_call"] < mean["per_call_with_caller"]
    assert 0 < layout["ratio_inline_to_per_call"] < 1
    assert mean["prefill_row_reuse"] < mean["prefill_re_prefill"]

    trl = report["trl"]
    if importlib.util.find_spec("trl") is None:
        assert "skipped" in trl
    else:
        for side in ("ours", "trl"):
            assert trl[side]["min"] <= trl[side]["median"] <= trl[side]["max"] and len(trl[side]["runs"]) == 2
        assert set(trl["ratio"]) == {"min", "median", "max"}


def test_only_runs_the_named_sections(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--quick", "--only", "layout"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert "layout" in report and "peak" in report  # the peak is always the reference
    assert not {"training", "rollout", "trl"} & set(report)
    with pytest.raises(SystemExit):
        parse_args(["--only", "training,nonsense"])


def test_per_call_rows_end_after_each_response() -> None:
    # roles: context 0, act 1, rehearse 2; two calls whose responses end at positions 6 and 10
    assert call_row_ends([0, 1, 1, 0, 2, 2, 0, 1, 0, 2, 0]) == [6, 10]
    assert call_row_ends([0, 1, 1]) == []


def test_prefill_counts_with_and_without_row_reuse() -> None:
    # a 3-token shared prefix, then an act (3:5), a rehearsal (6:8) and an act (9:10)
    roles = [0, 0, 0, 1, 1, 0, 2, 2, 0, 1, 0]
    assert generation_spans(roles) == [(3, 5), (6, 8), (9, 10)]
    # again: each call prefills its history past the prefix: 0 + 3 + 6;
    # reuse: only what is new to the row, the previous last sampled token included: 0 + 2 + 2
    assert prefill_tokens(roles, prefix=3) == (9, 4)
