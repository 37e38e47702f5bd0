"""The app never loads torch, and imports no engine module but the torch-free ones: engine.config
(docs/architecture.md), engine.analysis, engine.export, engine.stages and engine.summary (the
warm-up rule the Live medians share with the run summary)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

APP_DIR = Path(__file__).resolve().parents[2] / "app"
APP_MODULES = sorted(".".join(p.relative_to(APP_DIR.parent).with_suffix("").parts)
                     for p in APP_DIR.rglob("*.py")
                     if p.stem != "__init__" and p.parent.name != "views")  # pages: scripts, see test_layout
TORCH_FREE_ENGINE = {"engine", "engine.config", "engine.analysis", "engine.export",
                     "engine.events", "engine.stages", "engine.summary", "engine.result", "engine.verdict"}  # events: through workers.store (history, sweeps)


def _loaded_after(mods: list[str]) -> set[str]:
    code = ("import sys\n" + "".join(f"import {m}\n" for m in mods) +
            "print(','.join(m for m in sys.modules if m.split('.')[0] in ('torch', 'engine')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return {m for m in out.stdout.strip().split(",") if m}


def test_app_modules_import_only_torch_free_engine_modules():
    assert {"app.frames.base", "app.runsets", "app.charts.buckets"} <= set(APP_MODULES)
    assert _loaded_after(APP_MODULES) <= TORCH_FREE_ENGINE


def test_app_with_real_client_loads_no_torch():
    if importlib.util.find_spec("workers.client") is None:
        return
    loaded = _loaded_after(APP_MODULES + ["workers.client"])
    assert not {m for m in loaded if m.split(".")[0] == "torch"}
