"""The app never loads torch, and itself imports no engine module but engine.config (DESIGN.md)."""

import importlib.util
import subprocess
import sys

APP_MODULES = ["app.frames", "app.charts", "app.window", "app.form", "app.connection",
               "app.panels"]


def _loaded_after(mods: list[str]) -> set[str]:
    code = ("import sys\n" + "".join(f"import {m}\n" for m in mods) +
            "print(','.join(m for m in sys.modules if m.split('.')[0] in ('torch', 'engine')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return {m for m in out.stdout.strip().split(",") if m}


def test_app_modules_import_only_engine_config():
    assert _loaded_after(APP_MODULES) <= {"engine", "engine.config"}


def test_app_with_real_client_loads_no_torch():
    if importlib.util.find_spec("workers.client") is None:
        return
    loaded = _loaded_after(APP_MODULES + ["workers.client"])
    assert not {m for m in loaded if m.split(".")[0] == "torch"}
