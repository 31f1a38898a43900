"""``envace export``: a checkpoint's policy (or simulator) as a ``save_pretrained`` folder that plain
transformers (merged) or peft (``--adapters``) loads with the same logits and greedy output as the
model ``load_checkpoint`` rebuilds; bad input gives exit code 2 and one line."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from envace.cli import main as envace
from envace.commands.export import HUB_BASES, MANIFEST, adapter_base, role_prefix
from envace.policy import LoraSpec, PolicySpec, load_checkpoint, load_model, load_tokenizer, packaged_folder

LORA = LoraSpec(r=4, target_modules=["q_proj", "v_proj"])
PROMPT = "<|im_start|>user\nList the files in /tmp, please.<|im_end|>\n<|im_start|>assistant\n"


def _adapters(spec: PolicySpec, seed: int, prefix: str) -> dict[str, torch.Tensor]:
    """The trainable weights of ``spec`` under ``prefix``, lora_B perturbed (seeded) so adapters matter."""
    model = load_model(spec)
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            value = torch.randn(p.shape, generator=gen) * 0.5 if "lora_B" in name else p.detach().clone()
            state[prefix + name] = value
    return state


def _save(path: Path, state: dict[str, torch.Tensor], spec: PolicySpec) -> Path:
    """A file shaped like the training module's Lightning checkpoint."""
    ckpt = {"state_dict": state, "envace": {"policy": dataclasses.asdict(spec), "tool_style": "compact"}}
    torch.save(ckpt | {"global_step": 3}, path)
    return path


def _export(ckpt: Path, out: Path, *flags: str) -> int:
    return envace(["export", "--ckpt", str(ckpt), "--out", str(out), *flags])


def _outputs(model: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits on the prompt and 12 greedy tokens after it."""
    tok = load_tokenizer("tiny")
    ids = torch.tensor([tok(PROMPT)["input_ids"]])
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=ids).logits
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=12,
                             do_sample=False, pad_token_id=tok.pad_token_id)  # fmt: skip
    return logits, out


def _assert_same(exported: Any, reference: Any) -> None:
    (logits, ids), (ref_logits, ref_ids) = _outputs(exported), _outputs(reference)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=0)


@pytest.fixture()
def lora_ckpt(tmp_path: Path) -> Path:
    spec = PolicySpec("tiny", lora=LORA)
    return _save(tmp_path / "lora.ckpt", _adapters(spec, 1, "policy."), spec)


def test_lora_checkpoint_exports_merged_for_plain_transformers(lora_ckpt: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "export"
    assert _export(lora_ckpt, out) == 0
    assert "role act: exporting the policy.* weights" in capsys.readouterr().out
    files = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", MANIFEST} <= files
    assert "adapter_config.json" not in files
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp folder left
    model = AutoModelForCausalLM.from_pretrained(out)
    assert not any("lora_" in n for n, _ in model.named_parameters())
    _assert_same(model, load_checkpoint(PolicySpec("tiny"), str(lora_ckpt)))
    assert not torch.allclose(_outputs(model)[0], _outputs(load_model(PolicySpec("tiny")))[0])  # adapters matter
    tok = AutoTokenizer.from_pretrained(out)
    assert tok(PROMPT)["input_ids"] == load_tokenizer("tiny")(PROMPT)["input_ids"]
    record = json.loads((out / MANIFEST).read_text())
    assert record["source"] == str(lora_ckpt.resolve()) and record["role"] == "act" and record["format"] == "merged"
    assert record["global_step"] == 3 and record["tool_style"] == "compact" and record["weights"] == "policy.*"
    assert record["policy"]["name_or_path"] == "tiny" and record["policy"]["lora"]["r"] == 4


def test_full_checkpoint_exports_its_weights(tmp_path: Path) -> None:
    trained = load_model(PolicySpec("tiny", seed=3))
    state = {f"policy.{k}": v for k, v in trained.state_dict().items()}
    ckpt = _save(tmp_path / "full.ckpt", state, PolicySpec("tiny", seed=0))  # weights come from the file
    assert _export(ckpt, tmp_path / "export") == 0
    _assert_same(AutoModelForCausalLM.from_pretrained(tmp_path / "export"), trained)


def test_rehearse_exports_the_simulator_when_there_is_one(lora_ckpt: Path, tmp_path: Path, capsys) -> None:
    spec = PolicySpec("tiny", lora=LORA)
    state = _adapters(spec, 1, "policy.") | _adapters(spec, 2, "simulator.")
    both = _save(tmp_path / "both.ckpt", state, spec)
    assert _export(both, tmp_path / "act") == 0
    assert _export(both, tmp_path / "rehearse", "--role", "rehearse") == 0
    assert "role rehearse: exporting the simulator.* weights" in capsys.readouterr().out
    act = AutoModelForCausalLM.from_pretrained(tmp_path / "act")
    rehearse = AutoModelForCausalLM.from_pretrained(tmp_path / "rehearse")
    _assert_same(rehearse, load_checkpoint(PolicySpec("tiny"), str(both), prefix="simulator."))
    _assert_same(act, load_checkpoint(PolicySpec("tiny"), str(both)))
    assert not torch.allclose(_outputs(act)[0], _outputs(rehearse)[0])
    assert json.loads((tmp_path / "rehearse" / MANIFEST).read_text())["weights"] == "simulator.*"
    # one model plays both roles: rehearse exports the policy
    assert _export(lora_ckpt, tmp_path / "one", "--role", "rehearse") == 0
    assert "no simulator.* weights; exporting policy.*" in capsys.readouterr().out
    _assert_same(
        AutoModelForCausalLM.from_pretrained(tmp_path / "one"), load_checkpoint(PolicySpec("tiny"), str(lora_ckpt))
    )


def test_adapters_folder_loads_in_peft(tmp_path: Path) -> None:
    from peft import AutoPeftModelForCausalLM

    base = tmp_path / "base"  # a tiny model saved as a folder: a base that adapters can name
    load_model(PolicySpec("tiny", seed=1)).save_pretrained(base)
    load_tokenizer("tiny").save_pretrained(base)
    spec = PolicySpec(str(base), lora=LORA)
    ckpt = _save(tmp_path / "lora.ckpt", _adapters(spec, 4, "policy."), spec)
    out = tmp_path / "adapters"
    assert _export(ckpt, out, "--adapters") == 0
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(base.resolve()) and not (out / "model.safetensors").exists()
    assert json.loads((out / MANIFEST).read_text())["format"] == "adapters"
    reference = load_checkpoint(PolicySpec(str(base)), str(ckpt))
    _assert_same(AutoPeftModelForCausalLM.from_pretrained(out), reference)
    assert _export(ckpt, tmp_path / "merged") == 0
    _assert_same(AutoModelForCausalLM.from_pretrained(tmp_path / "merged"), reference)


def test_adapters_name_a_hub_base_and_tiny_needs_one(lora_ckpt: Path, tmp_path: Path, capsys) -> None:
    base, note = adapter_base(PolicySpec("smollm2-135m"))  # the packaged model: the hub model it came from
    assert base == HUB_BASES["smollm2-135m"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert note is not None and "Q4_1" in note and "export merged" in note
    assert adapter_base(PolicySpec("smollm2-135m"), base=str(packaged_folder())) == (
        str(packaged_folder().resolve()),
        None,  # the packaged weights themselves: exact, but only on this machine
    )
    assert adapter_base(PolicySpec("org/model")) == ("org/model", None)
    assert _export(lora_ckpt, tmp_path / "out", "--adapters") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("envace export: error: --adapters: the 'tiny' test model") and "--base FOLDER" in err
    assert "\n" not in err and not (tmp_path / "out").exists()
    assert _export(lora_ckpt, tmp_path / "out", "--base", str(tmp_path)) == 2  # --base without --adapters
    assert "--base names the base model of --adapters" in capsys.readouterr().err


def test_the_packaged_models_adapters_name_the_hub_id(tmp_path: Path, capsys) -> None:
    spec = PolicySpec("smollm2-135m", lora=LORA)
    ckpt = _save(tmp_path / "lora.ckpt", _adapters(spec, 5, "policy."), spec)
    assert _export(ckpt, tmp_path / "adapters", "--adapters") == 0
    config = json.loads((tmp_path / "adapters" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    record = json.loads((tmp_path / "adapters" / MANIFEST).read_text())
    assert record["base_model_name_or_path"] == config["base_model_name_or_path"] and "Q4_1" in record["note"]
    assert "note: the adapters were trained on the packaged smollm2-135m" in capsys.readouterr().out


# a fresh interpreter that imports only torch, transformers and peft: what a user elsewhere runs
LOADER = """
import json, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
prompt, merged, adapters = sys.argv[1:]
outputs = []
for folder in (merged, adapters):
    if folder == adapters:
        from peft import AutoPeftModelForCausalLM
        model = AutoPeftModelForCausalLM.from_pretrained(folder)
    else:
        model = AutoModelForCausalLM.from_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    ids = torch.tensor([tok(prompt)["input_ids"]])
    with torch.no_grad():
        out = model.eval().generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=12,
                                    do_sample=False, pad_token_id=tok.pad_token_id)
    outputs.append(out[0].tolist())
assert not [m for m in sys.modules if m.split(".")[0] == "envace"], "envace was imported"
print(json.dumps(outputs))
"""


def _greedy_elsewhere(merged: Path, adapters: Path) -> list[list[int]]:
    """The greedy ids of each folder, decoded in a fresh interpreter without envace."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-c", LOADER, PROMPT, str(merged), str(adapters)], cwd=merged.parent,
                         env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_exports_load_without_envace_and_decode_as_the_checkpoint(tmp_path: Path) -> None:
    base = tmp_path / "tiny-base"  # the tiny model's weights as a folder: a base that adapters can name
    load_model(PolicySpec("tiny", seed=1)).save_pretrained(base)
    load_tokenizer("tiny").save_pretrained(base)
    spec = PolicySpec("tiny", seed=1, lora=LORA)
    ckpt = _save(tmp_path / "lora.ckpt", _adapters(spec, 6, "policy."), spec)
    expected = _outputs(load_checkpoint(PolicySpec("tiny", seed=1), str(ckpt)))[1][0].tolist()
    assert expected != _outputs(load_model(PolicySpec("tiny", seed=1)))[1][0].tolist()  # the adapters matter
    assert _export(ckpt, tmp_path / "merged") == 0
    assert _export(ckpt, tmp_path / "adapters", "--adapters", "--base", str(base)) == 0
    config = json.loads((tmp_path / "adapters" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(base.resolve())
    assert _greedy_elsewhere(tmp_path / "merged", tmp_path / "adapters") == [expected, expected]


def test_bad_input_exits_2_with_one_line(lora_ckpt: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "busy"
    out.mkdir()
    (out / "old.txt").write_text("keep me")
    assert _export(lora_ckpt, out) == 2
    err = capsys.readouterr().err.strip()
    assert "is not empty: pass --force" in err and "\n" not in err and (out / "old.txt").exists()
    assert _export(lora_ckpt, out, "--force") == 0
    assert not (out / "old.txt").exists() and (out / "config.json").exists()
    capsys.readouterr()
    assert _export(tmp_path / "missing.ckpt", tmp_path / "new") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("envace export: error: checkpoint not found:") and "\n" not in err
    assert _export(lora_ckpt, tmp_path, "--force") == 2  # would delete the checkpoint itself
    assert "holds the checkpoint" in capsys.readouterr().err and lora_ckpt.exists()


def test_role_prefix() -> None:
    assert role_prefix(["policy.w"], "act")[0] == "policy."
    assert role_prefix(["policy.w", "simulator.w"], "act")[0] == "policy."
    assert role_prefix(["policy.w", "simulator.w"], "rehearse")[0] == "simulator."
    assert role_prefix(["policy.w"], "rehearse")[0] == "policy."
    with pytest.raises(ValueError, match="--role must be one of act, rehearse"):
        role_prefix(["policy.w"], "judge")


def test_adapters_in_bf16_hold_the_checkpoints_weights_rounded(tmp_path: Path) -> None:
    """``--dtype bfloat16``: every saved adapter weight is the checkpoint's, rounded to bf16 (half the
    bytes), and peft loads the folder; the manifest names the dtype."""
    from safetensors.torch import load_file

    base = tmp_path / "base"
    load_model(PolicySpec("tiny", seed=1)).save_pretrained(base)
    load_tokenizer("tiny").save_pretrained(base)
    spec = PolicySpec(str(base), lora=LORA)
    state = _adapters(spec, 4, "policy.")
    ckpt = _save(tmp_path / "lora.ckpt", state, spec)
    full, half = tmp_path / "fp32", tmp_path / "bf16"
    assert _export(ckpt, full, "--adapters") == 0 and _export(ckpt, half, "--adapters", "--dtype", "bfloat16") == 0
    saved, saved32 = load_file(half / "adapter_model.safetensors"), load_file(full / "adapter_model.safetensors")
    assert saved.keys() == saved32.keys() and len(saved) > 0
    for name, value in saved.items():
        assert value.dtype == torch.bfloat16 and torch.equal(value, saved32[name].to(torch.bfloat16))
    size = {f: (f / "adapter_model.safetensors").stat().st_size for f in (full, half)}
    assert size[half] < 0.6 * size[full]
    assert json.loads((half / MANIFEST).read_text())["dtype"] == "bfloat16"
    from peft import PeftModel

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), half)
    lora = [p for n, p in model.named_parameters() if "lora_B" in n]
    assert lora and all(p.abs().sum() > 0 for p in lora)
