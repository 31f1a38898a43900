"""scripts/code_shape.py: the layer order of docs/architecture.md, checked on a small package built
here — an upward import and an upward registry string each fail it, downward ones do not."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "scripts" / "code_shape.py"
_spec = importlib.util.spec_from_file_location("code_shape", SCRIPT)
assert _spec and _spec.loader
code_shape = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(code_shape)


def _package(root: Path, files: dict[str, str]) -> Path:
    """``root/envace/...`` holding ``files`` (path -> source), every package with its ``__init__.py``."""
    for rel, source in {"__init__.py": "", "types.py": "X = 1\n", **files}.items():
        path = root / "envace" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.relative_to(root).parents:
            if parent != Path(".") and not (root / parent / "__init__.py").exists():
                (root / parent / "__init__.py").write_text("")
        path.write_text(source)
    return root


def _breaches(root: Path) -> list[str]:
    mods = code_shape.modules(root)
    return code_shape.layer_breaches(mods, set(mods))


TYPE_ONLY = "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from envace.rollout.loop import X\n"
DOWNWARD = {
    "envs/base.py": "from envace.types import X\n",
    "rewards/score.py": "REGISTRY = {'x': 'envace.rewards.score:f'}\n\ndef f():\n    return 1\n",
    "rollout/loop.py": "from envace.envs.base import X\nNAMED = 'envace.envs.base:X'\n",
}


def test_downward_imports_and_registry_strings_pass(tmp_path: Path) -> None:
    assert _breaches(_package(tmp_path, DOWNWARD)) == []


@pytest.mark.parametrize(
    ("extra", "breach"),
    [
        # rewards (layer 1) importing envs (layer 2)
        ({"rewards/up.py": "from envace.envs.base import X\n"}, "envace.rewards.up imports envace.envs.base"),
        # the same dependency through a registry string: imported by name at run time
        ({"rewards/up.py": "R = {'env': 'envace.envs.base:X'}\n"}, "envace.rewards.up names (registry string)"),
        # a type-only import counts: the record belongs in a lower layer
        (
            {"envs/up.py": TYPE_ONLY},
            "envace.envs.up imports envace.rollout.loop: layer 3 above its 2",
        ),
        # a package the architecture does not place
        ({"studies/x.py": "Y = 2\n"}, "studies is in no layer of LAYERS"),
    ],
)
def test_an_upward_dependency_is_a_breach(tmp_path: Path, extra: dict[str, str], breach: str) -> None:
    found = _breaches(_package(tmp_path, {**DOWNWARD, **extra}))
    assert len(found) == 1 and found[0].startswith(breach), found


def test_the_script_fails_on_a_breach_and_passes_on_this_package(tmp_path: Path) -> None:
    bad = _package(tmp_path, {**DOWNWARD, "rewards/up.py": "R = {'env': 'envace.envs.base:X'}\n"})
    run = lambda *a: subprocess.run([sys.executable, str(SCRIPT), *a], capture_output=True, text=True, timeout=120)  # noqa: E731
    failed = run("--root", str(bad))
    assert failed.returncode == 1 and "layer breach: envace.rewards.up names (registry string)" in failed.stdout
    ours = run()
    assert ours.returncode == 0, ours.stdout[-2000:]
