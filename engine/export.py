"""Exports of a run's events: JSONL, CSV (step events), and a Chrome trace for Perfetto.

Pure Python (no torch). The Chrome trace uses the Trace Event Format's complete events
(`"ph": "X"`, microseconds; https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU).
Complete events on one thread must nest or be disjoint (Perfetto drops the ones that partly
overlap), and a rank's bucket all-reduces do overlap each other (bucket i+1 starts while bucket i
is still in flight). So each rank (DDP, FSDP) or device (DP) is a process in the trace, with a thread
for its steps or DP phases, one thread per gradient bucket (a bucket's all-reduce of step s
ends before its all-reduce of step s+1 starts) and, for FSDP, one thread per collective kind
(FSDP2 issues its all-gathers on one stream and its reduce-scatters on another, so each kind
runs one at a time).
"""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

SAFE_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class ExportFormat:
    """One export: the file name's suffix after the run id, its MIME type, a button label."""

    suffix: str
    mime: str
    label: str


# The one table of export files: `ddpviz export`, the app's downloads and the doctor name them so.
EXPORT_FORMATS = {
    "jsonl": ExportFormat(".jsonl", "application/x-ndjson", "Events (JSONL)"),
    "csv": ExportFormat(".steps.csv", "text/csv", "Steps (CSV)"),
    "trace": ExportFormat(".trace.json", "application/json", "Chrome trace (Perfetto)"),
}
# The steps CSV's columns, in order. New ones go at the end so readers of the older columns keep working:
# `memory_traced` and `replica_check` (the instrument's own work is in that step's times; the summary's
# medians leave such steps out, `engine.summary.INSTRUMENT_FLAGS`) and `comm_exposed_source` (how
# `comm_exposed_s` was measured), empty where a step event lacks them (docs/events.md, `step`).
STEP_COLUMNS = ("rank", "device", "step", "loss", "samples", "step_time_s", "forward_s", "backward_s",
                "comm_exposed_s", "optimizer_s", "samples_per_s", "start_ts",
                "memory_traced", "replica_check", "comm_exposed_source")
STEP_SPAN_ARGS = ("loss", "forward_s", "backward_s", "comm_exposed_s", "optimizer_s")  # a trace step span's args


def to_jsonl(events: Iterable[dict[str, Any]]) -> str:
    return "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in events)


def steps_csv(events: Iterable[dict[str, Any]]) -> str:
    """One row per `step` event: the columns of `STEP_COLUMNS`, the step-time split (seconds), throughput
    (samples/s) and the flags of steps that carry the instrument's own work; a cell is empty where the
    event lacks that field."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=STEP_COLUMNS, extrasaction="ignore")
    w.writeheader()
    for e in events:
        if e.get("type") == "step":
            w.writerow(e)
    return buf.getvalue()


def _process(e: dict[str, Any], mode: str) -> str:
    return f"device {e.get('device')}" if mode == "dp" else f"rank {e.get('rank', 0)} ({e.get('device')})"


class _Tracks:
    """pids per process name (a rank or device) and tids per (process, thread name), in order."""

    def __init__(self) -> None:
        self.pids: dict[str, int] = {}
        self.tids: dict[tuple[str, str], int] = {}

    def ids(self, process: str, thread: str) -> tuple[int, int]:
        pid = self.pids.setdefault(process, len(self.pids) + 1)
        return pid, self.tids.setdefault((process, thread), len(self.tids) + 1)

    def metadata(self) -> list[dict[str, Any]]:
        meta: list[dict[str, Any]] = []
        for name, pid in self.pids.items():
            meta += [dict(name="process_name", ph="M", pid=pid, args={"name": name}),
                     dict(name="process_sort_index", ph="M", pid=pid, args={"sort_index": pid})]
        for (process, name), tid in self.tids.items():
            pid = self.pids[process]
            meta += [dict(name="thread_name", ph="M", pid=pid, tid=tid, args={"name": name}),
                     dict(name="thread_sort_index", ph="M", pid=pid, tid=tid, args={"sort_index": tid})]
        return meta


def chrome_trace(events: list[dict[str, Any]]) -> dict[str, Any]:
    """A Trace Event Format object: a process per rank (DDP) or device (DP); in it a thread
    ``steps`` (DDP step spans) or ``phases`` (DP), and a thread ``all-reduce, bucket b`` per
    bucket. Times in microseconds since the epoch."""
    started = next((e for e in events if e.get("type") == "run_started"), {})
    mode = started.get("mode", "ddp")
    steps = {(e.get("rank", 0), e["step"]): e for e in events if e.get("type") == "step"}
    tracks = _Tracks()
    out: list[dict[str, Any]] = []

    def span(name: str, cat: str, track: tuple[str, str], start_s: float, dur_s: float, args: dict) -> None:
        pid, tid = tracks.ids(*track)
        out.append(dict(name=name, cat=cat, ph="X", pid=pid, tid=tid, ts=start_s * 1e6,
                        dur=max(dur_s, 0.0) * 1e6, args=args))

    for (rank, step), e in sorted(steps.items(), key=lambda kv: kv[0][::-1]):
        if "start_ts" in e and mode != "dp":
            span(f"step {step}", "step", (_process(e, mode), "steps"), e["start_ts"], e["step_time_s"],
                 {k: e[k] for k in STEP_SPAN_ARGS if k in e})
    for e in events:
        t = e.get("type")
        base = steps.get((e.get("rank", 0), e.get("step")))
        if base is None or "start_ts" not in base:
            continue
        if t == "dp_phase":
            span(e["phase"], "dp_phase", (_process(e, "dp"), "phases"), base["start_ts"] + e["start_s"],
                 e["end_s"] - e["start_s"], {"nbytes": e.get("nbytes", 0), "step": e["step"]})
        elif t == "bucket" and base.get("backward_start_ts") is not None and e.get("comm_start_s") is not None \
                and e.get("comm_end_s") is not None:  # an all-reduce whose end was not measured: no span
            name = (f"DDP {e['ddp_index']} bucket {e['bucket_index']}" if e.get("ddp_index")
                    else f"bucket {e['bucket_index']}")  # an attached process's second DDP, ...
            span(f"all-reduce {name}", "bucket", (_process(e, mode), f"all-reduce, {name}"),
                 base["backward_start_ts"] + e["comm_start_s"], e["comm_end_s"] - e["comm_start_s"],
                 {"nbytes": e["nbytes"], "ready_s": e["ready_s"], "step": e["step"]})
        elif t == "fsdp_collective" and e.get("end_s") is not None:
            kind = e["kind"].replace("_", "-")
            span(f"{kind} {e['unit']} ({e['phase']})", "fsdp", (_process(e, mode), kind),
                 base["start_ts"] + e["start_s"], e["end_s"] - e["start_s"],
                 {"nbytes": e["nbytes"], "dtype": e.get("dtype"), "step": e["step"]})
    return {"traceEvents": tracks.metadata() + out, "displayTimeUnit": "ms"}


def render(events: list[dict[str, Any]], fmt: str) -> str:
    """The text of export `fmt` (a key of `EXPORT_FORMATS`) of `events`.

    Raises:
        ValueError: `fmt` is not jsonl, csv or trace.
    """
    if fmt == "jsonl":
        return to_jsonl(events)
    if fmt == "csv":
        return steps_csv(events)
    if fmt == "trace":
        return json.dumps(chrome_trace(events), separators=(",", ":"))
    raise ValueError(f"format must be one of {sorted(EXPORT_FORMATS)} (got {fmt!r})")


def export_path(folder: str | Path, run_id: str, suffix: str) -> Path:
    """`folder/<run_id><suffix>`, refusing ids that could escape `folder`.

    Raises:
        ValueError: `run_id` is not 1-64 characters of letters, digits, '-' and '_'.
    """
    if not SAFE_ID.match(run_id or ""):
        raise ValueError(f"run_id must be 1-64 letters, digits, '-' or '_' (got {run_id!r})")
    root = Path(folder).resolve()
    path = (root / f"{run_id}{suffix}").resolve()
    if path.parent != root:
        raise ValueError(f"run_id {run_id!r} would write outside {root}")
    return path
