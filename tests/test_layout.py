"""The structure the design fixes: imports point one way (app -> workers -> engine), and the
modules the app loads stay free of torch."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "engine": {"app", "workers", "redis", "rq", "streamlit", "altair"},
    "workers": {"app", "streamlit", "altair"},
}


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_point_one_way(package):
    bad = {str(p.relative_to(ROOT)): sorted(imported_roots(p) & FORBIDDEN[package])
           for p in (ROOT / package).rglob("*.py")}
    assert {k: v for k, v in bad.items() if v} == {}


@pytest.mark.parametrize("module", ["engine.config", "engine.analysis", "engine.export", "engine.stages",
                                    "engine.result", "engine.run", "workers.client", "engine.predict",
                                    "workers.scaleout"])
def test_modules_the_app_loads_do_not_import_torch(module):
    code = f"import sys, {module}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"


# -- no import cycles inside a package (docs/architecture.md) --------------------------------------

PACKAGES = ("app", "workers", "engine")


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def internal_imports(path: Path, package: str, modules: set[str]) -> set[str]:
    """Modules of `package` that `path` imports anywhere in its body (module level or inside a
    function: a lazy import still ties the two modules together)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}  # `from workers import keys`
    return {m for m in found if m in modules and m.split(".")[0] == package}


def import_graph(package: str) -> dict[str, set[str]]:
    files = {module_name(p): p for p in (ROOT / package).rglob("*.py")}
    modules = set(files)
    return {m: internal_imports(p, package, modules) - {m, package} for m, p in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every elementary cycle found by a depth-first search, each once (as the modules on it)."""
    found, seen = [], set()

    def visit(node: str, path: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt in path:
                cycle = path[path.index(nxt):]
                key = frozenset(cycle)
                if key not in seen:
                    seen.add(key)
                    found.append(cycle + [nxt])
            elif len(path) < 12:
                visit(nxt, path + [nxt])

    for start in sorted(graph):
        visit(start, [start])
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycles_inside_a_package(package):
    assert cycles(import_graph(package)) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_code_cites_the_projects_own_docs_not_files_outside_the_repository():
    cited = {str(p.relative_to(ROOT)) for package in (*PACKAGES, "tests") for p in (ROOT / package).rglob("*.py")
             if "DESIGN" + ".md" in p.read_text()}
    assert cited == set()
