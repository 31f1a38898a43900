"""The package's shape, measured: file sizes over a limit, functions over a length, import cycles and
the layer order of docs/architecture.md.

    python scripts/code_shape.py [--lines 400] [--function-lines 60] [--root src]

Exits 1 when a module is over ``--lines``, the import graph of ``envace`` has a cycle, a package
imports outside what ``ALLOWED`` gives it, or a module depends on a later layer of ``LAYERS``
(imports, type-only ones included, and registry strings such as ``"envace.envs.bfcl:BFCLEnvironment"``,
which import a module by name at run time), other than the ``EXCEPTIONS`` the architecture names.
"""

from __future__ import annotations

import argparse
import ast
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "src"
#: packages whose imports are restricted: the rewards need no environment, data or rollout
ALLOWED = {"envace.rewards": {"envace.types", "envace.protocol", "envace._bfcl"}}
#: the layers of docs/architecture.md, in order: a package depends only on its own layer and earlier ones
LAYERS = (
    ("types", "hardware", "policy", "paths", "_bfcl"),
    ("protocol", "rewards", "losses", "metrics"),
    ("envs",),
    ("data", "rollout"),
    ("inference",),
    ("evaluation",),
    ("modules",),
    ("callbacks",),
    ("commands", "bench", "cli", "experiment"),
)
#: dependencies on a later layer that the architecture names, each with its reason
EXCEPTIONS: dict[tuple[str, str], str] = {}
REGISTRY = re.compile(r"envace(?:\.\w+)+(?::\w+)?")


def modules(root: Path = ROOT) -> dict[str, Path]:
    out = {}
    for path in sorted((root / "envace").rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _resolve(target: str, known: set[str]) -> str:
    while target and target not in known:
        target = target.rsplit(".", 1)[0] if "." in target else ""
    return target


def imports(name: str, path: Path, known: set[str], type_only: bool = False) -> set[str]:
    """The envace modules ``name`` imports at module level or in functions (``type_only``: TYPE_CHECKING
    blocks too, else they are left out)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    skip: set[int] = set()
    for node in ast.walk(tree):
        if not type_only and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for n in ast.walk(node)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for target in targets:
            t = _resolve(target, known)
            if t and t != name:
                found.add(t)
    return found


def registry_names(name: str, path: Path, known: set[str]) -> set[str]:
    """The envace modules ``name`` names in string constants (``"envace.envs.bfcl:BFCLEnvironment"``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and REGISTRY.fullmatch(node.value):
            t = _resolve(node.value.split(":", 1)[0], known)
            if t and t != name:
                found.add(t)
    return found


def layer_of(module: str) -> int | None:
    """The index in :data:`LAYERS` of a module's top package (``None``: the package is in no layer)."""
    top = module.split(".")[1] if "." in module else ""
    return next((i for i, layer in enumerate(LAYERS) if top in layer), None if top else -1)


def _excepted(module: str, target: str) -> bool:
    return any(
        (module == m or module.startswith(m + ".")) and (target == t or target.startswith(t + "."))
        for m, t in EXCEPTIONS
    )


def layer_breaches(mods: dict[str, Path], known: set[str]) -> list[str]:
    """Every dependency on a later layer (imports, type-only ones included, and registry strings) not in
    :data:`EXCEPTIONS`, and every package that is in no layer."""
    out = sorted({f"{m.split('.')[1]} is in no layer of LAYERS" for m in mods if layer_of(m) is None})
    for m, path in mods.items():
        edges = [(t, "imports") for t in sorted(imports(m, path, known, type_only=True))]
        edges += [(t, "names (registry string)") for t in sorted(registry_names(m, path, known))]
        mine = layer_of(m)
        for t, how in edges:
            theirs = layer_of(t)
            if mine is not None and theirs is not None and theirs > mine and not _excepted(m, t):
                out.append(f"{m} {how} {t}: layer {theirs} above its {mine}")
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def functions(path: Path) -> list[tuple[str, int, int]]:
    """Every function's name, its lines, and its lines without the docstring."""
    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            total = (node.end_lineno or node.lineno) - node.lineno + 1
            first = node.body[0]
            doc = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            doc_lines = (first.end_lineno or first.lineno) - first.lineno + 1 if doc else 0
            out.append((node.name, total, total - doc_lines))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=400)
    ap.add_argument("--function-lines", type=int, default=60)
    ap.add_argument("--root", type=Path, default=ROOT, help="the src folder to measure (e.g. an older worktree's)")
    args = ap.parse_args()
    mods = modules(args.root)
    known = set(mods)
    graph = {m: imports(m, p, known) for m, p in mods.items()}
    # a package's __init__ importing its own submodules is not a cycle through the package
    for m in graph:
        graph[m] = {t for t in graph[m] if not (m.startswith(t + ".") and t in known)}
    found = cycles(graph)
    sizes = {m: len(p.read_text().splitlines()) for m, p in mods.items()}
    funcs = [(m, f, n, code) for m, p in mods.items() for f, n, code in functions(p)]
    long = sorted([x for x in funcs if x[2] > args.function_lines], key=lambda x: -x[2])
    median = statistics.median(x[2] for x in funcs)
    print(f"{len(mods)} modules, {sum(sizes.values())} lines; {len(funcs)} functions, median {median:.0f} lines")
    print("largest modules: " + ", ".join(f"{m} {n}" for m, n in sorted(sizes.items(), key=lambda x: -x[1])[:5]))
    print(f"functions over {args.function_lines} lines: {len(long)} (lines, lines without the docstring)")
    for m, f, n, code in long:
        print(f"  {n:4d} {code:4d}  {m}.{f}")
    over = [(m, n) for m, n in sizes.items() if n > args.lines]
    for m, n in over:
        print(f"module over {args.lines} lines: {m} ({n})")
    for comp in found:
        print("import cycle: " + " <-> ".join(comp))
    breaches = [
        f"{m} imports {t}"
        for m, targets in graph.items()
        for pkg, allowed in ALLOWED.items()
        if m == pkg or m.startswith(pkg + ".")
        for t in sorted(targets)
        if not (t == pkg or t.startswith(pkg + ".")) and not any(t == a or t.startswith(a + ".") for a in allowed)
    ]
    breaches += layer_breaches(mods, known)
    for b in breaches:
        print(f"layer breach: {b}")
    print(f"import cycles: {len(found)}")
    return 1 if over or found or breaches else 0


if __name__ == "__main__":
    sys.exit(main())
