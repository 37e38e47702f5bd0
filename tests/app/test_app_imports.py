"""The app never loads torch, and imports no engine module but the torch-free ones: engine.config
(docs/architecture.md), engine.analysis, engine.export, engine.stages and engine.summary (the
warm-up rule the Live medians share with the run summary)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

APP_DIR = Path(__file__).resolve().parents[2] / "app"
APP_MODULES = sorted("ddpviz." + ".".join(p.relative_to(APP_DIR.parent).with_suffix("").parts)
                     for p in APP_DIR.rglob("*.py")
                     if p.stem != "__init__" and p.parent.name != "views")  # pages: scripts, see test_layout
TORCH_FREE_ENGINE = {"ddpviz.engine", "ddpviz.engine.measure", "ddpviz.engine.measure.bootstrap", "ddpviz.engine.config", "ddpviz.engine.analysis", "ddpviz.engine.export",
                     "ddpviz.engine.events", "ddpviz.engine.stages", "ddpviz.engine.summary", "ddpviz.engine.result", "ddpviz.engine.verdict",
                     "ddpviz.engine.measure.own_threads",
                     "ddpviz.engine.measure.gil", "ddpviz.engine.measure.gil_rank"}
# events: through workers.store (history, sweeps); own_threads: events' writer thread names itself; gil, gil_rank:
# the verdict reads what a DDP rank's `gil` source says (BACKWARD_LEFT_OUT)


def _loaded_after(*groups: list[str]) -> list[set[str]]:
    """The torch and engine modules loaded after importing each group in turn, in one fresh
    interpreter (one snapshot per group: the app's imports cost seconds, paid once)."""
    code = "import sys\n"
    for mods in groups:
        code += "".join(f"import {m}\n" for m in mods)
        code += "print(','.join(m for m in sys.modules if m.split('.')[0] in ('torch', 'engine') or m.startswith('ddpviz.engine')))\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return [{m for m in line.strip().split(",") if m} for line in out.stdout.splitlines()]


@pytest.fixture(scope="module")
def loaded() -> tuple[set[str], set[str] | None]:
    """(after the app's modules, after the app's modules and workers.client or None without it)."""
    if importlib.util.find_spec("ddpviz.workers.client") is None:
        return _loaded_after(APP_MODULES)[0], None
    return tuple(_loaded_after(APP_MODULES, ["ddpviz.workers.client"]))


def test_app_modules_import_only_torch_free_engine_modules(loaded):
    assert {"ddpviz.app.frames.base", "ddpviz.app.runsets", "ddpviz.app.charts.buckets"} <= set(APP_MODULES)
    assert loaded[0] <= TORCH_FREE_ENGINE


def test_app_with_real_client_loads_no_torch(loaded):
    if loaded[1] is None:
        return
    assert not {m for m in loaded[1] if m.split(".")[0] == "torch"}
