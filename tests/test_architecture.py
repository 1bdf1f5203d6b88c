"""The package layout is the architecture: lower layers never import upper ones, and no module imports in a cycle."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "nmt"

# Lowest first (docs/architecture.md). A subpackage may import its own layer's modules and lower layers;
# subpackages on the same layer do not import each other.
LAYERS = {"common": 0, "data": 1, "model": 2, "inference": 3, "export": 4, "serve": 4, "train": 4, "analysis": 5,
          "chain": 6}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """Every ``nmt``/``nmt_tools`` module that ``path`` imports, at any depth (imports inside functions count)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.lineno, node.module)]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
    return [(line, name) for line, name in found if name.split(".")[0] in ("nmt", "nmt_tools")]


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_subpackage_has_a_layer_and_a_docstring() -> None:
    subpackages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert subpackages <= set(LAYERS), f"give {sorted(subpackages - set(LAYERS))} a layer in LAYERS"
    for name in subpackages:
        init = (PACKAGE / name / "__init__.py").read_text()
        assert ast.get_docstring(ast.parse(init)), f"nmt/{name} has no docstring"


def test_no_module_imports_an_upper_layer_or_a_sibling_package() -> None:
    upward = []
    for path in modules():
        mine = path.relative_to(PACKAGE).parts
        if len(mine) == 1:
            continue  # nmt/__init__.py re-exports the public API
        for line, name in imported_modules(path):
            parts = name.split(".")
            if parts[0] == "nmt_tools":
                upward.append(f"{path}:{line} imports {name} (the measuring tools are never imported by nmt)")
            elif len(parts) > 1 and parts[1] in LAYERS and parts[1] != mine[0] and LAYERS[parts[1]] >= LAYERS[mine[0]]:
                upward.append(f"{path}:{line} ({mine[0]}) imports {name}")
    assert not upward, "\n".join(upward)


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from nmt.train.trainer import train\n")
    assert imported_modules(bad) == [(2, "nmt.train.trainer")]


def test_no_import_cycle_between_modules() -> None:
    names = {module_name(path): path for path in modules()}
    graph = {
        name: {target for _, target in imported_modules(path) if target in names and target != name}
        for name, path in names.items()
    }
    for package in {n for n in names if (PACKAGE.parent / n.replace(".", "/") / "__init__.py").exists()}:
        graph[package] = set()  # a package's re-exports are not a dependency of its modules

    def cycle_from(start: str) -> list[str] | None:
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    return path + [start]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))
        return None

    cycles = [cycle for name in graph if (cycle := cycle_from(name))]
    assert not cycles, " ; ".join(" -> ".join(c) for c in cycles)


def test_module_docstrings_are_short_and_functions_fit_on_a_screen() -> None:
    long_docs, long_functions = [], []
    for path in modules():
        tree = ast.parse(path.read_text())
        doc = ast.get_docstring(tree) or ""
        if len(doc.splitlines()) > 4 or "not done here" in doc.lower() or "not here" in doc.lower():
            long_docs.append(str(path.relative_to(PACKAGE)))
        long_functions += [f"{path.relative_to(PACKAGE)}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
                           for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                           and node.end_lineno - node.lineno + 1 > 60]
    assert not long_docs, f"module docstrings are a sentence or a short paragraph: {long_docs}"
    assert not long_functions, long_functions
