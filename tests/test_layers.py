"""The floors of the house: imports go one way, as ARCHITECTURE.md's `## Layers` table says.

Every module under specjax/ is parsed (imports inside functions and relative imports
included, no module is imported) and placed in a layer of the table; a module may import
its own layer and the layers below, never above, and no modules may import each other in a
cycle. The config files in configs/ import only the layers up to the config files' own
(no JAX), which is also checked by loading them in a fresh process.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "specjax"
ARCHITECTURE = ROOT / "ARCHITECTURE.md"
#: The layer the config files import up to (a row of the table, by name).
CONFIG_LAYER = "config files' API"
#: Third-party packages a config file may import (besides the standard library).
CONFIG_THIRD_PARTY = {"ml_collections"}
#: Cycles that exist today in code owned elsewhere, each with why it is still there. The
#: test fails when one of them is gone (delete its entry then), or when any other appears.
KNOWN_CYCLES: dict[frozenset[str], str] = {}


@dataclasses.dataclass(frozen=True)
class Layer:
    index: int  # 1 = bottom
    name: str
    patterns: tuple[str, ...]  # dotted module names; "pkg.*" = the package and its modules


@dataclasses.dataclass(frozen=True)
class Import:
    source: str  # importing module
    path: Path
    line: int
    target: str  # imported module (the longest existing prefix of what is named)


def read_layers(text: str) -> list[Layer]:
    """The `## Layers` table of ARCHITECTURE.md, bottom first."""
    m = re.search(r"^## Layers\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert m, "ARCHITECTURE.md has no '## Layers' section"
    layers = []
    for row in m.group(1).splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if not row.startswith("|") or len(cells) != 3 or not cells[0].isdigit():
            continue
        # Module names are the backticked words starting with "specjax" (others are notes).
        patterns = tuple(re.findall(r"`(specjax(?:\.[\w*]+)*)`", cells[2]))
        assert patterns, f"layer {cells[1]!r} names no module"
        layers.append(Layer(int(cells[0]), cells[1], patterns))
    assert layers, "the '## Layers' section holds no table rows"
    assert [layer.index for layer in layers] == list(range(1, len(layers) + 1)), (
        "the layers must be numbered 1, 2, ... from the bottom"
    )
    return layers


def package_modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of specjax (a package as its __init__)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def layer_of(module: str, layers: list[Layer]) -> Layer | None:
    """The layer of the most specific pattern matching `module`."""
    best, best_len = None, -1
    for layer in layers:
        for p in layer.patterns:
            if p.endswith(".*"):
                base = p[:-2]
                hit = module == base or module.startswith(base + ".")
                length = len(base)
            else:
                hit, length = module == p, len(p) + 1  # an exact name beats a package
            if hit and length > best_len:
                best, best_len = layer, length
    return best


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(
    source: str, path: Path, modules: dict[str, Path], top_level_only: bool = False
) -> list[Import]:
    """The specjax modules `source` imports (anywhere in the file, unless `top_level_only`),
    `from a import b` resolved to module a.b when it exists, relative imports resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = source if path.name == "__init__.py" else source.rpartition(".")[0]
    nodes = tree.body if top_level_only else ast.walk(tree)
    out = []
    for node in nodes:
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            names = [
                f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module
                for a in node.names
            ]
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
        ):
            names = [node.args[0].value]
        for name in names:
            target = _resolve(name, modules) if name.split(".")[0] == "specjax" else None
            imp = Import(source, path, node.lineno, target)
            if target is not None and target != source and imp not in out:
                out.append(imp)
    return out


def _graph():
    layers = read_layers(ARCHITECTURE.read_text(encoding="utf-8"))
    modules = package_modules()
    edges = [imp for name, path in modules.items() for imp in imports_of(name, path, modules)]
    return layers, modules, edges


def _where(imp: Import) -> str:
    path = imp.path.relative_to(ROOT) if imp.path.is_relative_to(ROOT) else imp.path
    return f"{path}:{imp.line}"


def upward_imports(layers: list[Layer], edges: list[Import]) -> list[str]:
    errors = []
    for imp in edges:
        src, dst = layer_of(imp.source, layers), layer_of(imp.target, layers)
        if src is not None and dst is not None and dst.index > src.index:
            errors.append(
                f"{_where(imp)}: {imp.source} imports {imp.target}, but layer "
                f"{src.index} '{src.name}' may not import layer {dst.index} "
                f"'{dst.name}' (ARCHITECTURE.md, ## Layers)"
            )
    return errors


def import_cycles(edges: list[Import]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for imp in edges:
        graph.setdefault(imp.source, set()).add(imp.target)
        graph.setdefault(imp.target, set())
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph) + 100))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


# ------------------------------------------------------------------------------ the table


def test_every_module_is_in_one_layer_and_every_row_names_a_module():
    layers, modules, _ = _graph()
    unplaced = [m for m in modules if layer_of(m, layers) is None]
    assert not unplaced, (
        f"modules in no layer of ARCHITECTURE.md's ## Layers table (add them to a row): {unplaced}"
    )
    for layer in layers:
        for p in layer.patterns:
            base = p[:-2] if p.endswith(".*") else p
            assert base in modules, (
                f"layer {layer.index} '{layer.name}' names {p!r}, which is no module of specjax"
            )


def test_the_table_is_parsed_bottom_first():
    text = (
        "## Layers\n\n| # | layer | modules |\n|---|---|---|\n"
        "| 1 | low | `specjax.a`, `specjax.b.*` (`f`: a note) |\n"
        "| 2 | high | `specjax.b.c` |\n\n## Next\n| 3 | x | `specjax.y` |\n"
    )
    layers = read_layers(text)
    assert [(la.index, la.name, la.patterns) for la in layers] == [
        (1, "low", ("specjax.a", "specjax.b.*")),
        (2, "high", ("specjax.b.c",)),
    ]
    assert layer_of("specjax.b.c", layers).name == "high"  # the most specific row wins
    assert layer_of("specjax.b.d", layers).name == "low"
    assert layer_of("specjax.b", layers).name == "low"
    assert layer_of("specjax.c", layers) is None


# ------------------------------------------------------------------------------ the order


def test_no_module_imports_a_layer_above_its_own():
    layers, _, edges = _graph()
    errors = upward_imports(layers, edges)
    assert not errors, "imports going up the layers:\n" + "\n".join(errors)


def test_a_package_is_no_higher_than_its_modules():
    """Importing a module runs its packages' ``__init__`` first, so they are in its layer or
    below (``specjax/__init__.py`` eagerly importing the policy made every import pay it)."""
    layers, modules, _ = _graph()
    errors = []
    for name in modules:
        layer = layer_of(name, layers)
        parts = name.split(".")
        for k in range(1, len(parts)):
            parent = ".".join(parts[:k])
            up = layer_of(parent, layers)
            if layer is not None and up is not None and up.index > layer.index:
                errors.append(
                    f"{parent} (layer {up.index} '{up.name}') is above its module "
                    f"{name} (layer {layer.index} '{layer.name}')"
                )
    assert not errors, "\n".join(errors)


def test_no_import_cycles():
    _, _, edges = _graph()
    cycles = {frozenset(c): c for c in import_cycles(edges)}
    new = [c for k, c in cycles.items() if k not in KNOWN_CYCLES]
    assert not new, "modules importing each other in a cycle:\n" + "\n".join(
        " <-> ".join(c)
        + ": "
        + "; ".join(
            f"{_where(e)} {e.source} -> {e.target}"
            for e in edges
            if e.source in c and e.target in c
        )
        for c in new
    )
    gone = [sorted(k) for k in KNOWN_CYCLES if k not in cycles]
    assert not gone, f"known cycles that are gone (delete them from KNOWN_CYCLES): {gone}"


def test_the_checks_see_function_level_relative_and_cyclic_imports(tmp_path):
    """The parser on a made-up package: a relative import inside a function going up, and a
    two-module cycle, are both reported with the importing module and line."""
    pkg = tmp_path / "specjax"
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "__init__.py").write_text("")
    (pkg / "low" / "a.py").write_text("import os\n\ndef f():\n    from ..high import b\n")
    (pkg / "high.py").write_text("from specjax.low import c\n")
    (pkg / "low" / "c.py").write_text("import specjax.high\n")
    modules = {
        "specjax": pkg / "__init__.py",
        "specjax.low": pkg / "low" / "__init__.py",
        "specjax.low.a": pkg / "low" / "a.py",
        "specjax.high": pkg / "high.py",
        "specjax.low.c": pkg / "low" / "c.py",
    }
    layers = [Layer(1, "low", ("specjax", "specjax.low.*")), Layer(2, "high", ("specjax.high",))]
    edges = [imp for n, p in modules.items() for imp in imports_of(n, p, modules)]
    assert sorted((e.source, e.line, e.target) for e in edges) == [
        ("specjax.high", 1, "specjax.low.c"),
        ("specjax.low.a", 4, "specjax.high"),
        ("specjax.low.c", 1, "specjax.high"),
    ]
    errors = upward_imports(layers, edges)
    assert len(errors) == 2 and "specjax.low.a imports specjax.high" in errors[0]
    assert "a.py:4: " in errors[0] and "layer 1 'low' may not import layer 2 'high'" in errors[0]
    assert import_cycles(edges) == [["specjax.high", "specjax.low.c"]]


# ------------------------------------------------------------------------------ configs


def _config_files() -> list[Path]:
    files = sorted((ROOT / "configs").glob("*.py"))
    assert files, "no config files in configs/"
    return files


def test_configs_import_only_the_config_layer_and_below():
    layers, modules, _ = _graph()
    ceiling = next(la for la in layers if la.name == CONFIG_LAYER)
    errors = []
    for path in _config_files():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                assert not node.level, f"{path.name}:{node.lineno}: a relative import"
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                where = f"{path.relative_to(ROOT)}:{node.lineno}: imports {name}"
                if top == "specjax":
                    layer = layer_of(_resolve(name, modules) or name, layers)
                    if layer is None or layer.index > ceiling.index:
                        errors.append(
                            f"{where} (layer {layer.index if layer else '?'}); "
                            f"configs import layers 1-{ceiling.index} only"
                        )
                elif top not in CONFIG_THIRD_PARTY and top not in sys.stdlib_module_names:
                    errors.append(
                        f"{where}; configs import only {sorted(CONFIG_THIRD_PARTY)}, "
                        f"the standard library and specjax layers 1-{ceiling.index}"
                    )
    assert not errors, "\n".join(errors)


def test_loading_every_config_imports_no_jax(tmp_path):
    """Each config loaded by path, as the CLI does, from another working directory."""
    layers, _, _ = _graph()
    ceiling = next(la for la in layers if la.name == CONFIG_LAYER)
    code = (
        "import importlib.machinery, json, sys\n"
        f"for i, path in enumerate({[str(p) for p in _config_files()]!r}):\n"
        "    module = importlib.machinery.SourceFileLoader(f'config_{i}', path).load_module()\n"
        "    module.get_config()\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    loaded = json.loads(out.stdout.splitlines()[-1])
    heavy = [m for m in loaded if m.split(".")[0] in ("jax", "jaxlib", "flax", "optax", "orbax")]
    above = [
        m
        for m in loaded
        if m.split(".")[0] == "specjax"
        and (layer_of(m, layers) is None or layer_of(m, layers).index > ceiling.index)
    ]
    assert not heavy and not above, f"loading the configs imported {heavy + above}"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
