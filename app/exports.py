"""A run's events as downloadable files: JSONL, CSV of steps, Chrome trace (Perfetto).

The bytes are made only when a download button is pressed (Streamlit calls the callable then),
from the whole stream read through `workers.history.read_all_events`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ddpviz.engine.export import EXPORT_FORMATS, SAFE_ID, render
from ddpviz.workers.history import read_all_events


@dataclass(frozen=True)
class ExportFile:
    label: str  # button text
    file_name: str
    mime: str
    make: Callable[[], bytes]


def export_files(client, run_id: str) -> list[ExportFile]:
    """The three downloads of one run.

    Raises:
        ValueError: `run_id` is not a safe file name (see `engine.export.SAFE_ID`).
    """
    if not SAFE_ID.match(run_id):
        raise ValueError(f"run id {run_id!r} is not a safe file name")

    def maker(kind: str) -> Callable[[], bytes]:
        return lambda: render(read_all_events(client, run_id), kind).encode()

    return [ExportFile(f.label, f"{run_id}{f.suffix}", f.mime, maker(kind)) for kind, f in EXPORT_FORMATS.items()]
