"""The structure docs/architecture.md describes, checked: imports point one way (app -> workers ->
engine), no cycles, no mode imports another mode, the predictor and what the app loads stay free
of torch, frames and charts stay pure, folders stay small and each package's docstring maps it."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "engine": {"app", "workers", "redis", "rq", "streamlit", "altair"},
    "workers": {"app", "streamlit", "altair"},
    # the public package runs inside the user's training processes, which never talk to Redis
    "ddpviz": {"app", "workers", "redis", "rq", "streamlit", "altair"},
}


OURS = ("app", "engine", "workers")  # installed as ddpviz.app, ddpviz.engine, ddpviz.workers (pyproject.toml)


def root_of(module: str) -> str:
    """The folder (or outside package) a dotted import names: ddpviz.engine.x -> engine, torch.nn -> torch."""
    parts = module.split(".")
    return parts[1] if parts[0] == "ddpviz" and len(parts) > 1 and parts[1] in OURS else parts[0]


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots |= {root_of(a.name) for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            roots.add(root_of(node.module))
            if node.module == "ddpviz":  # from ddpviz import engine
                roots |= {a.name for a in node.names if a.name in OURS}
    return roots


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_point_one_way(package):
    bad = {str(p.relative_to(ROOT)): sorted(imported_roots(p) & FORBIDDEN[package])
           for p in (ROOT / package).rglob("*.py")}
    assert {k: v for k, v in bad.items() if v} == {}


PREDICT = sorted("ddpviz." + ".".join(p.relative_to(ROOT).with_suffix("").parts)
                 for p in (ROOT / "engine" / "predict").glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("module", ["ddpviz.engine.config", "ddpviz.engine.analysis", "ddpviz.engine.export", "ddpviz.engine.stages",
                                    "ddpviz.engine.result", "ddpviz.engine.run", "ddpviz.engine.summary", "ddpviz.engine.verdict", "ddpviz.workers.client",
                                    "ddpviz.workers.scaleout", "ddpviz.workers.tunes", "ddpviz.engine.measure.bootstrap",
                                    *PREDICT])
def test_modules_the_app_loads_do_not_import_torch(module):
    code = f"import sys, {module}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"


def test_ddpviz_run_launches_a_command_without_importing_torch(tmp_path, redis_url):
    """`ddpviz run`'s launcher needs no torch (its command's processes import it): importing it
    cost each launch 2-5 s of CPU before the command started (engine.attach.started, for a name)."""
    code = ("import sys\nfrom ddpviz.workers.cli.commands import main\ntry:\n"
            f"    main(['run', '--url', {redis_url!r}, '--spool', {str(tmp_path / 'spool')!r}, '--', 'true'])\n"
            "except SystemExit as e:\n    print('exit', e.code)\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.stdout.split()[-3:] == ["exit", "0", "False"], (out.stdout, out.stderr[-2000:])


# -- no import cycles inside a package (docs/architecture.md) --------------------------------------

PACKAGES = ("app", "workers", "engine", "ddpviz")


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts) if parts[0] == "ddpviz" else "ddpviz." + ".".join(parts)


def internal_imports(path: Path, package: str, modules: set[str]) -> set[str]:
    """Modules of `package` that `path` imports anywhere in its body (module level or inside a
    function: a lazy import still ties the two modules together). ``from pkg import sub`` ties
    `path` to the submodule `pkg.sub`, not to the package's ``__init__`` (a map and, at most,
    re-exports)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            subs = {f"{node.module}.{a.name}" for a in node.names} & modules  # `from workers import keys`
            names = [a for a in node.names if f"{node.module}.{a.name}" not in modules]
            found |= subs | ({node.module} if names else set())
    return {m for m in found if m in modules and root_of(m) == package}


def import_graph(package: str) -> dict[str, set[str]]:
    files = {module_name(p): p for p in (ROOT / package).rglob("*.py")}
    modules = set(files)
    top = "ddpviz" if package == "ddpviz" else f"ddpviz.{package}"
    return {m: internal_imports(p, package, modules) - {m, top} for m, p in files.items()}


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


def test_the_cycle_finder_sees_a_lazy_import(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "a.py").write_text("def f():\n    from pkg import b\n")
    (pkg / "b.py").write_text("from pkg.a import f\n")
    modules = {"pkg.a", "pkg.b"}
    assert internal_imports(pkg / "a.py", "pkg", modules) == {"pkg.b"}
    assert internal_imports(pkg / "b.py", "pkg", modules) == {"pkg.a"}


# -- folders by concept -----------------------------------------------------------------------------

MODES = ("dp", "ddp", "fsdp")


def _modules_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("mode", MODES)
def test_no_mode_imports_another_mode(mode):
    others = {f"ddpviz.engine.modes.{m}" for m in MODES if m != mode}
    bad = {}
    for path in _modules_under(ROOT / "engine" / "modes" / mode):
        tree = ast.parse(path.read_text(), str(path))
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        hits = sorted(m for m in names if any(m == o or m.startswith(o + ".") for o in others))
        if hits:
            bad[str(path.relative_to(ROOT))] = hits
    assert bad == {}


@pytest.mark.parametrize("folder, banned", [("app/frames", {"streamlit", "altair"}), ("app/charts", {"streamlit"}),
                                            ("engine/predict", {"torch"})])
def test_pure_folders_import_nothing_they_must_not(folder, banned):
    bad = {str(p.relative_to(ROOT)): sorted(imported_roots(p) & banned) for p in _modules_under(ROOT / folder)}
    assert {k: v for k, v in bad.items() if v} == {}


def test_pages_import_only_torch_free_engine_modules():
    allowed = {"ddpviz.engine.config", "ddpviz.engine.analysis", "ddpviz.engine.export", "ddpviz.engine.stages", "ddpviz.engine.summary",
               "ddpviz.engine.result", "ddpviz.engine.verdict", "ddpviz.engine.events",
               "ddpviz.engine.measure.gil"}  # torch-free: the GIL meter's step rule, named on Learn
    allowed |= {m for m in PREDICT}
    bad = {}
    for path in _modules_under(ROOT / "app"):
        tree = ast.parse(path.read_text(), str(path))
        mods = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and not n.level}
        mods |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        hits = sorted(m for m in mods if root_of(m) == "engine" and m not in allowed)
        if hits:
            bad[str(path.relative_to(ROOT))] = hits
    assert bad == {}


MAX_MODULES_PER_FOLDER = 20


def package_folders() -> list[Path]:
    return sorted({p.parent for package in PACKAGES for p in (ROOT / package).rglob("__init__.py")})


@pytest.mark.parametrize("folder", package_folders(), ids=lambda p: str(p.relative_to(ROOT)))
def test_each_folder_is_small_and_its_init_docstring_maps_it(folder):
    modules = sorted(p.stem for p in folder.glob("*.py") if p.stem not in ("__init__", "__main__"))
    subfolders = sorted(p.name for p in folder.iterdir() if (p / "__init__.py").is_file())
    assert len(modules) <= MAX_MODULES_PER_FOLDER, f"{folder.relative_to(ROOT)}: {len(modules)} modules"
    doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
    unnamed = [m for m in modules + subfolders if not re.search(rf"\b{m}\b", doc)]
    assert unnamed == [], f"{folder.relative_to(ROOT)}/__init__.py does not map {unnamed}"


def test_pyproject_installs_every_folder_under_the_one_import_name():
    """Every package folder of app/, engine/, workers/ is listed in pyproject.toml as ddpviz.<folder>
    (an unlisted folder would be missing from a wheel, e.g. the Docker image), and nothing else is."""
    import tomllib

    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setup["package-dir"] == {"ddpviz": "ddpviz", **{f"ddpviz.{p}": p for p in OURS}}
    folders = {"ddpviz"} | {"ddpviz." + ".".join(d.relative_to(ROOT).parts)
                            for p in OURS for d in [ROOT / p, *(ROOT / p).rglob("*")]
                            if d.is_dir() and any(d.glob("*.py")) and "__pycache__" not in d.parts}
    assert set(setup["packages"]) == folders
