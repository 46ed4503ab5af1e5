"""The layers import only downwards: read every module's imports (lazy ones included) and hold them to the rules.

The rules are the package docstring's (``dcpinspect/__init__.py``) and
docs/ARCHITECTURE.md's; this test is what keeps them true.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from paths import ROOT

PACKAGE = ROOT / "dcpinspect"

#: package -> the packages it may import (itself always)
ALLOWED: dict[str, set[str]] = {
    "protocol": set(),
    "wire": {"protocol"},
    "flows": {"wire", "protocol"},
    "capture": {"flows", "wire", "protocol"},
    "timeline": {"flows", "wire", "protocol"},
    "tables": {"timeline", "capture", "flows", "wire", "protocol"},
    "views": {"tables", "timeline", "capture", "flows", "wire", "protocol"},
    "live": {"capture", "flows", "wire", "protocol"},
    "spark": {"views", "tables", "timeline", "capture", "flows", "wire", "protocol"},
    "cli": {"spark", "live", "views", "tables", "timeline", "capture", "flows", "wire", "protocol"},
}
HEAVY = {"numpy", "pandas", "pyarrow", "matplotlib", "ipywidgets", "anywidget", "pyspark", "scapy", "IPython"}
#: who may import each heavy library (besides the top-level facade, lazily)
HEAVY_ALLOWED = {
    "numpy": {"tables", "views", "spark"},
    "pandas": {"tables", "views", "spark"},
    "pyarrow": {"tables", "views", "spark"},
    "matplotlib": {"views"},
    "ipywidgets": {"views"},
    "anywidget": {"views"},
    "IPython": {"views"},
    "pyspark": {"spark"},
    "scapy": {"live"},
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str) -> Iterator[tuple[str, list[str], int]]:
    """(absolute module imported, names taken from it, line) for every import in module ``name``, lazy ones included."""
    path = MODULES[name]
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, [], node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [a.name for a in node.names]
            if target in MODULES and f"{target}.{names[0]}" in MODULES and not node.module and node.level:
                for n in names:  # from . import module
                    yield f"{target}.{n}", [], node.lineno
            elif f"{target}.{names[0]}" in MODULES and all(f"{target}.{n}" in MODULES for n in names):
                for n in names:  # from .pkg import module
                    yield f"{target}.{n}", [], node.lineno
            else:
                yield target, names, node.lineno


def _layer(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ALLOWED else None


def _internal_edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for m in MODULES:
        for target, _names, _line in _imports(m):
            if target in MODULES and target != m:
                edges[m].add(target)
    return edges


def test_layers_import_only_downwards() -> None:
    wrong = []
    for m, path in MODULES.items():
        layer = _layer(m)
        if layer is None:
            continue
        for target, _names, line in _imports(m):
            if not target.startswith("dcpinspect"):
                continue
            other = _layer(target)
            if target == "dcpinspect" or (other is not None and other != layer and other not in ALLOWED[layer]):
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {layer} imports {target}")
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles_lazy_imports_included() -> None:
    edges = _internal_edges()
    # a package's __init__ re-exporting its own modules is not a cycle of the data flow
    for m in list(edges):
        if MODULES[m].name == "__init__.py":
            edges[m] = set()
    seen: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(m: str) -> None:
        seen[m] = 1
        stack.append(m)
        for n in sorted(edges[m]):
            if seen.get(n) == 1:
                cycles.append([*stack[stack.index(n) :], n])
            elif n not in seen:
                visit(n)
        stack.pop()
        seen[m] = 2

    for m in sorted(edges):
        if m not in seen:
            visit(m)
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_no_module_uses_another_modules_private_names() -> None:
    wrong = []
    for m, path in MODULES.items():
        for target, names, line in _imports(m):
            if target in MODULES and target != m:
                private = [n for n in names if n.startswith("_") and not n.startswith("__")]
                if private:
                    wrong.append(f"{path.relative_to(ROOT)}:{line}: {target} {', '.join(private)}")
        wrong += _private_attributes(m)
    assert not wrong, "\n".join(wrong)


def _private_attributes(m: str) -> list[str]:
    """``module._name`` where ``module`` is another of the package's modules bound by an import."""
    tree = ast.parse(MODULES[m].read_text())
    package = m if MODULES[m].name == "__init__.py" else m.rpartition(".")[0]
    aliases = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.split(".")
            base = base[: len(base) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
            aliases |= {a.asname or a.name for a in node.names if f"{target}.{a.name}" in MODULES}
    return [
        f"{MODULES[m].relative_to(ROOT)}:{node.lineno}: {node.value.id}.{node.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in aliases
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
    ]


def test_heavy_libraries_only_where_allowed() -> None:
    wrong = []
    for m, path in MODULES.items():
        layer = _layer(m)
        for target, _names, line in _imports(m):
            top = target.split(".")[0]
            if top in HEAVY and m != "dcpinspect" and (layer is None or layer not in HEAVY_ALLOWED[top]):
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {m} imports {target}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("package", ["protocol", "wire", "flows", "capture", "timeline", "live", "cli", "spark"])
def test_light_packages_load_nothing_heavy(package: str) -> None:
    """Importing every module of a light package (and dcpinspect.spark's facade, and the CLI) loads no heavy library."""
    mods = [m for m in MODULES if _layer(m) == package] if package not in ("spark", "cli") else [f"dcpinspect.{package}"]
    code = (
        "import importlib, sys\n"
        f"for m in {mods!r}: importlib.import_module(m)\n"
        f"print(sorted(m for m in {sorted(HEAVY)!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout.strip()
    assert out == "[]", f"{package}: {out}"


def test_every_package_states_its_theory_of_operation() -> None:
    for layer in ALLOWED:
        doc = ast.get_docstring(ast.parse((PACKAGE / layer / "__init__.py").read_text())) or ""
        assert "TODO" not in doc and len(doc.splitlines()) >= 5 and "1." in doc, f"{layer}/__init__.py needs its theory of operation"
