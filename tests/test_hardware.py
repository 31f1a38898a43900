"""Capability detection and the choices made from it, on every branch whatever this CPU is:
``ENVACE_BF16`` forces the answer, and oneDNN's refusal to prepack is simulated."""

from __future__ import annotations

import warnings

import pytest
import torch

from envace import hardware
from envace.rollout import GenerationEngine, SamplingConfig
from envace.rollout.engine import PackedLinear


@pytest.fixture()
def no_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(hardware.ENV, "none")
    monkeypatch.setattr(hardware, "bf16_slowdown", lambda size=256: 97.0)  # not timed in a test


@pytest.fixture()
def oneDNN_refuses(monkeypatch: pytest.MonkeyPatch):  # noqa: N802
    """oneDNN raising on every prepack, as it does for bf16 on an AVX2 CPU."""

    def refuse(*args, **kwargs):
        raise RuntimeError("mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx_ne_convert or avx512bw")

    hardware._prepack_works.cache_clear()
    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", refuse)
    yield
    hardware._prepack_works.cache_clear()


@pytest.mark.parametrize(
    ("flags", "machine", "slowdown", "native", "named"),
    [
        ({"avx2", "fma"}, "x86_64", 97.0, False, "no bf16 flag"),  # AMD Zen 2/3, Intel before Cooper Lake
        ({"avx2", "avx512f", "avx512bw"}, "x86_64", 12.0, False, "no bf16 flag"),  # AVX-512 without its bf16 part
        ({"avx512f", "avx512_bf16"}, "x86_64", 0.25, True, "avx512_bf16 present"),
        ({"amx_bf16", "amx_tile"}, "x86_64", 0.1, True, "amx_bf16 present"),
        ({"asimd", "bf16"}, "aarch64", 0.6, True, "arm bf16 present"),
        ({"asimd", "fphp"}, "aarch64", 40.0, False, "no bf16 flag"),
        (
            {"avx512_bf16"},
            "x86_64",
            97.0,
            False,
            "avx512_bf16 present",
        ),  # flag there, kernels not (ATEN_CPU_CAPABILITY)
        (set(), "arm64", 0.5, True, "no bf16 flag"),  # flags unreadable: the measurement decides
    ],
)
def test_native_bf16_is_measured_and_explained_by_the_flags(
    monkeypatch, flags, machine, slowdown, native, named
) -> None:
    monkeypatch.delenv(hardware.ENV, raising=False)
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset(flags))
    monkeypatch.setattr(hardware, "bf16_slowdown", lambda size=256: slowdown)
    monkeypatch.setattr(hardware.platform, "machine", lambda: machine)
    cap = hardware.capability()
    assert cap.cpu_bf16 is native
    assert named in cap.reason and cap.reason.startswith("no native bf16") is not native


def test_the_measurement_is_a_real_matmul_ratio() -> None:
    slowdown = hardware.bf16_slowdown()
    assert slowdown > 0
    assert hardware.capability().cpu_bf16 is (slowdown < hardware.FAST) or hardware.forced() is not None


@pytest.mark.parametrize("value", ["native", "none"])
def test_the_environment_variable_forces_the_answer(monkeypatch, value: str) -> None:
    monkeypatch.setenv(hardware.ENV, value)
    native = value == "native"
    assert hardware.native_bf16() is native and hardware.capability().reason == f"forced by {hardware.ENV}={value}"
    assert hardware.training_precision("auto") == ("bf16-mixed" if native else "32-true")
    assert hardware.sampling_dtype("auto") == ("bfloat16" if native else None)
    for explicit in ("32-true", "bf16-mixed", 16, None):  # only auto is resolved
        assert hardware.training_precision(explicit) == explicit
    assert hardware.sampling_dtype("float32") == "float32" and hardware.sampling_dtype(None) is None


def test_a_bad_forced_value_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.setenv(hardware.ENV, "yes")
    with pytest.raises(ValueError, match="ENVACE_BF16='yes'"):
        hardware.capability()


def test_prepacking_is_tried_not_assumed(oneDNN_refuses) -> None:
    assert not hardware.can_prepack(torch.float32) and not hardware.can_prepack(torch.bfloat16)


def test_forcing_bf16_off_turns_bf16_prepacking_off(no_bf16) -> None:
    assert not hardware.can_prepack(torch.bfloat16)


def test_explicit_bf16_without_native_support_warns_with_the_slowdown(no_bf16) -> None:
    with pytest.warns(UserWarning, match=r"trainer.precision=bf16-mixed .* 97x slower than fp32"):
        hardware.warn_if_slow("trainer.precision", "bf16-mixed")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hardware.warn_if_slow("trainer.precision", "32-true")  # nothing to say


def test_the_choice_is_described_in_one_line(no_bf16) -> None:
    line = hardware.describe("trainer.precision", "auto", "32-true")
    assert line == "envace: trainer.precision auto -> 32-true on cpu (forced by ENVACE_BF16=none)"
    assert "as configured" in hardware.describe("trainer.precision", "bf16-mixed", "bf16-mixed")


@pytest.mark.parametrize("forced", ["native", "none"])
def test_the_trainer_resolves_auto_precision(monkeypatch, capsys, forced: str) -> None:
    from envace.commands.fit_config import trainer_class

    monkeypatch.setenv(hardware.ENV, forced)
    hardware._announced.clear()
    trainer = trainer_class()(precision="auto", accelerator="cpu", logger=False, enable_checkpointing=False)
    assert trainer.precision == ("bf16-mixed" if forced == "native" else "32-true")
    assert f"trainer.precision auto -> {trainer.precision}" in capsys.readouterr().err


def _tokens(engine: GenerationEngine, prompts: list[list[int]], n: int) -> list[list[int]]:
    torch.manual_seed(1)
    return [s.ids for s in engine.generate(prompts, n)]


def test_unpackable_weights_fall_back_to_plain_ones_with_the_same_samples(tiny_model, oneDNN_refuses) -> None:
    prompts = [torch.randint(10, 1000, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (20, 27)]
    fallback = GenerationEngine(tiny_model, stop_ids=[-1], pad_id=2, sampling=SamplingConfig())
    assert not any(isinstance(m, PackedLinear) for m in fallback.sampler().modules())
    got = _tokens(fallback, prompts, 8)
    plain = GenerationEngine(tiny_model, stop_ids=[-1], pad_id=2, sampling=SamplingConfig(pack_weights=False))
    assert got == _tokens(plain, prompts, 8)


def test_packed_and_plain_weights_give_the_same_samples(tiny_model) -> None:
    if not hardware.can_prepack(torch.float32):
        pytest.skip("oneDNN cannot prepack fp32 here: the plain path is the only one")
    prompts = [torch.randint(10, 1000, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (20, 27)]
    packed = GenerationEngine(tiny_model, stop_ids=[-1], pad_id=2, sampling=SamplingConfig())
    assert isinstance(packed.sampler().lm_head, PackedLinear)
    plain = GenerationEngine(tiny_model, stop_ids=[-1], pad_id=2, sampling=SamplingConfig(pack_weights=False))
    assert _tokens(packed, prompts, 8) == _tokens(plain, prompts, 8)


def test_bf16_asked_without_native_support_samples_plain_bf16_and_warns(tiny_model, no_bf16) -> None:
    engine = GenerationEngine(tiny_model, stop_ids=[-1], pad_id=2, sampling=SamplingConfig(dtype="bfloat16"))
    with pytest.warns(UserWarning, match="sampling.dtype=bfloat16"):
        sampler = engine.sampler()
    assert next(sampler.parameters()).dtype == torch.bfloat16
    assert not any(isinstance(m, PackedLinear) for m in sampler.modules())  # no crash in oneDNN's prepack
    assert len(engine.generate([[5, 6, 7, 8]], 3)[0].ids) == 3


def test_auto_sampling_follows_the_capability(tiny_model, monkeypatch) -> None:
    for forced, dtype in (("none", torch.float32), ("native", torch.bfloat16)):
        monkeypatch.setenv(hardware.ENV, forced)
        engine = GenerationEngine(tiny_model, stop_ids=[-1], pad_id=2, sampling=SamplingConfig(dtype="auto"))
        assert engine.sampling_dtype() == dtype
