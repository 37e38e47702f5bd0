"""A run's events as downloadable files: JSONL, CSV of steps, Chrome trace (Perfetto).

The bytes are made only when a download button is pressed (Streamlit calls the callable then),
from the whole stream read through `workers.history.read_all_events`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

from engine.export import SAFE_ID, chrome_trace, steps_csv, to_jsonl
from workers.history import read_all_events


@dataclass(frozen=True)
class ExportFile:
    label: str  # button text
    file_name: str
    mime: str
    make: Callable[[], bytes]


def render(events: list[dict[str, Any]], kind: str) -> bytes:
    """The file `kind` (jsonl | csv | trace) of `events`, UTF-8."""
    if kind == "jsonl":
        return to_jsonl(events).encode()
    if kind == "csv":
        return steps_csv(events).encode()
    if kind == "trace":
        return json.dumps(chrome_trace(events), separators=(",", ":")).encode()
    raise ValueError(f"kind must be jsonl, csv or trace (got {kind!r})")


def export_files(client, run_id: str) -> list[ExportFile]:
    """The three downloads of one run.

    Raises:
        ValueError: `run_id` is not a safe file name (see `engine.export.SAFE_ID`).
    """
    if not SAFE_ID.match(run_id):
        raise ValueError(f"run id {run_id!r} is not a safe file name")

    def maker(kind: str) -> Callable[[], bytes]:
        return lambda: render(read_all_events(client, run_id), kind)

    return [ExportFile("Events (JSONL)", f"{run_id}.jsonl", "application/x-ndjson", maker("jsonl")),
            ExportFile("Steps (CSV)", f"{run_id}-steps.csv", "text/csv", maker("csv")),
            ExportFile("Chrome trace (Perfetto)", f"{run_id}-trace.json", "application/json",
                       maker("trace"))]
