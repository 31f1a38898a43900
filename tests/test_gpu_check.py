"""The GPU check's preparations, checked here without a GPU: the wheels it carries cover what a fit
imports beyond the GPU image's packages, its shapes are the published ones, and it refuses a machine
without a GPU in one line. (The check itself is rehearsed on CPU by scripts/gpu_rehearsal.sh.)"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from gpu_check_models import SHAPES, shape_config  # noqa: E402

#: the GPU image: CPython 3.12 on x86_64 Linux
IMAGE_ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
             "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
             "platform_python_implementation": "CPython", "os_name": "posix", "extra": ""}  # fmt: skip
#: installed without their dependency trees (the Makefile's NODEPS, docs/design.md §4)
NO_DEPS = {"bfcl-eval"}
#: imported when present, never needed: transformers' hub kernels, and what pulls in dill here
OPTIONAL = {"kernels", "dill"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _names(path: Path) -> dict[str, str | None]:
    """``name -> pinned version or None`` of a requirements-style list (comments skipped)."""
    out: dict[str, str | None] = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            out[_norm(name)] = version or None
    return out


IMAGE, WHEELS = _names(ROOT / "scripts" / "gpu_image.txt"), _names(ROOT / "scripts" / "gpu_wheels.txt")


def test_every_wheel_is_pinned_and_none_is_in_the_image() -> None:
    assert WHEELS and all(WHEELS.values())
    assert not set(WHEELS) & set(IMAGE)


def test_the_wheels_bring_their_own_requirements() -> None:
    """Installed with --no-deps: what each wheel requires on the image must be there or carried too."""
    missing = {}
    for name in set(WHEELS) - NO_DEPS:
        dist = md.distribution(name)
        for text in dist.requires or []:
            req = Requirement(text)
            needed = req.marker is None or req.marker.evaluate(IMAGE_ENV)
            if needed and _norm(req.name) not in IMAGE and _norm(req.name) not in WHEELS:
                missing.setdefault(name, []).append(req.name)
    assert not missing


def test_the_wheels_cover_what_a_fit_imports_beyond_the_image() -> None:
    """Every distribution behind the modules a fit loads (the CLI, the module, rollouts, rewards, the
    BFCL source, environments and checker, the callbacks) is in the image or carried."""
    code = (
        "import importlib.metadata as md, json, sys\n"
        "import envace.cli, envace.modules, envace.callbacks, envace.rollout, envace.rewards\n"
        "from envace.data.sources import load_source\n"
        "from envace.envs import make_environment\n"
        "from envace.evaluation.official import official_score\n"
        "import jsonargparse, lightning.pytorch.cli\n"
        "task = load_source('bfcl-multi-turn', split='train', categories=['multi_turn_base'])[0]\n"
        "make_environment(task)\n"
        "pd = md.packages_distributions()\n"
        "print(json.dumps(sorted({d for m in list(sys.modules) for d in pd.get(m.split('.')[0], [])})))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    imported = {_norm(d) for d in json.loads(out.stdout.splitlines()[-1])}
    assert "jsonargparse" in imported and "torch" in imported  # the probe saw a fit's imports
    assert imported - set(IMAGE) - set(WHEELS) - OPTIONAL - {"envace"} == set()


def test_the_smollm2_shape_is_the_packaged_models(tokenizer) -> None:
    from envace.policy import packaged_folder

    packaged = json.loads((packaged_folder() / "config.json").read_text())
    ours = shape_config("smollm2-135m", tokenizer).to_dict()
    for key in [*SHAPES["smollm2-135m"][1], "vocab_size"]:
        where = "rope_parameters" if key == "rope_theta" else None  # transformers 5 keeps it there
        got, want = (ours[where][key], packaged[where][key]) if where else (ours[key], packaged[key])
        assert got == (pytest.approx(want, rel=1e-6) if isinstance(want, float) else want), key  # eps: float32


def test_the_qwen3_shape_counts_its_parameters(tokenizer) -> None:
    import torch
    from transformers import Qwen3ForCausalLM

    with torch.device("meta"):
        model = Qwen3ForCausalLM(shape_config("qwen3-0.6b", tokenizer))
    # Qwen3-0.6B: 28 x (attention 1024 -> 16x128 queries, 8x128 keys and values, back; MLP 3 x 1024 x 3072;
    # two norms of 1024, q/k norms of 128) + the tied embedding + the final norm
    layer = 1024 * 2048 * 2 + 1024 * 1024 * 2 + 3 * 1024 * 3072 + 2 * 1024 + 2 * 128
    assert sum(p.numel() for p in model.parameters()) == 28 * layer + len(tokenizer) * 1024 + 1024
    small = shape_config("qwen3-0.6b", tokenizer, layers=2, hidden=64)
    assert (small.num_hidden_layers, small.hidden_size, small.head_dim) == (2, 64, 16)


def test_no_gpu_fails_in_one_line(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"  # a PATH without nvidia-smi
    bin_dir.mkdir()
    for tool in ("bash", "dirname", "env"):
        (bin_dir / tool).symlink_to(shutil.which(tool) or tool)
    out = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], capture_output=True, text=True,
                         timeout=30, env={"PATH": str(bin_dir)})  # fmt: skip
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("gpu_check: no GPU")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a GPU is here")
def test_the_python_side_refuses_a_machine_without_cuda_unless_small(tmp_path: Path, capsys) -> None:
    import gpu_check

    (tmp_path / "tokenizer.json").write_text("{}")
    assert gpu_check.main(["--tokenizer", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no CUDA device" in err and "--small" in err
