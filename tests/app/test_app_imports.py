"""The app never loads torch or engine modules beyond engine.config (DESIGN.md: app -> workers)."""

import importlib.util
import subprocess
import sys

APP_MODULES = ["app.frames", "app.charts", "app.window", "app.form", "app.connection",
               "app.panels"]


def test_app_imports_no_torch():
    mods = APP_MODULES + (["workers.client"] if importlib.util.find_spec("workers.client") else [])
    code = ("import sys\n" + "".join(f"import {m}\n" for m in mods) +
            "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.') or "
            "(m.startswith('engine.') and m != 'engine.config'))\n"
            "print(','.join(bad))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"app pulled in: {out.stdout.strip()}"
