"""Measured figures of the reliability tests, for the README's "Reliability" table.

`record(name, value, unit)` prints the figure (visible with ``pytest -s``) and, when
``$DDPVIZ_RELIABILITY_JSON`` names a file, merges it into that JSON object, so one run of
``DDPVIZ_RELIABILITY_JSON=figures.json pytest tests/workers -k reliability`` collects them all.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

ENV_VAR = "DDPVIZ_RELIABILITY_JSON"


def record(name: str, value: float | int, unit: str) -> None:
    print(f"[reliability] {name} = {value:.3g} {unit}" if isinstance(value, float)
          else f"[reliability] {name} = {value} {unit}")
    target = os.environ.get(ENV_VAR)
    if not target:
        return
    path = Path(target)
    data = json.loads(path.read_text()) if path.is_file() else {}
    data[name] = {"value": value, "unit": unit}
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
