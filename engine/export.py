"""Exports of a run's events: JSONL, CSV (step events), and a Chrome trace for Perfetto.

Pure Python (no torch). The Chrome trace uses the Trace Event Format's complete events
(`"ph": "X"`, microseconds; https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU):
one track per rank (DDP, FSDP) or device (DP): step spans, DP phases, bucket all-reduces, FSDP's
all-gathers and reduce-scatters.
"""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path
from typing import Any, Iterable

SAFE_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
STEP_COLUMNS = ("rank", "device", "step", "loss", "samples", "step_time_s", "forward_s", "backward_s",
                "comm_exposed_s", "optimizer_s", "samples_per_s", "start_ts")


def to_jsonl(events: Iterable[dict[str, Any]]) -> str:
    return "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in events)


def steps_csv(events: Iterable[dict[str, Any]]) -> str:
    """One row per `step` event with the step-time split (seconds) and throughput (samples/s)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=STEP_COLUMNS, extrasaction="ignore")
    w.writeheader()
    for e in events:
        if e.get("type") == "step":
            w.writerow(e)
    return buf.getvalue()


def _track(e: dict[str, Any], mode: str) -> str:
    return f"device {e.get('device')}" if mode == "dp" else f"rank {e.get('rank', 0)} ({e.get('device')})"


def chrome_trace(events: list[dict[str, Any]]) -> dict[str, Any]:
    """A Trace Event Format object: pid 1, one tid per rank/device, spans in microseconds."""
    started = next((e for e in events if e.get("type") == "run_started"), {})
    mode = started.get("mode", "ddp")
    steps = {(e.get("rank", 0), e["step"]): e for e in events if e.get("type") == "step"}
    tids: dict[str, int] = {}
    out: list[dict[str, Any]] = []

    def span(name: str, cat: str, track: str, start_s: float, dur_s: float, args: dict) -> None:
        tid = tids.setdefault(track, len(tids) + 1)
        out.append(dict(name=name, cat=cat, ph="X", pid=1, tid=tid, ts=start_s * 1e6,
                        dur=max(dur_s, 0.0) * 1e6, args=args))

    for (rank, step), e in sorted(steps.items(), key=lambda kv: kv[0][::-1]):
        if "start_ts" in e and mode != "dp":
            span(f"step {step}", "step", _track(e, mode), e["start_ts"], e["step_time_s"],
                 {k: e[k] for k in ("loss", "forward_s", "backward_s", "comm_exposed_s") if k in e})
    for e in events:
        t = e.get("type")
        base = steps.get((e.get("rank", 0), e.get("step")))
        if base is None or "start_ts" not in base:
            continue
        if t == "dp_phase":
            span(e["phase"], "dp_phase", _track(e, "dp"), base["start_ts"] + e["start_s"],
                 e["end_s"] - e["start_s"], {"nbytes": e.get("nbytes", 0), "step": e["step"]})
        elif t == "bucket" and base.get("backward_start_ts") is not None and e.get("comm_start_s") is not None:
            span(f"all-reduce bucket {e['bucket_index']}", "bucket", _track(e, mode),
                 base["backward_start_ts"] + e["comm_start_s"], e["comm_end_s"] - e["comm_start_s"],
                 {"nbytes": e["nbytes"], "ready_s": e["ready_s"], "step": e["step"]})
        elif t == "fsdp_collective" and e.get("end_s") is not None:
            span(f"{e['kind'].replace('_', '-')} {e['unit']} ({e['phase']})", "fsdp", _track(e, mode),
                 base["start_ts"] + e["start_s"], e["end_s"] - e["start_s"],
                 {"nbytes": e["nbytes"], "dtype": e.get("dtype"), "step": e["step"]})
    meta = [dict(name="thread_name", ph="M", pid=1, tid=tid, args={"name": name}) for name, tid in tids.items()]
    meta.append(dict(name="process_name", ph="M", pid=1, args={"name": f"ddpviz {mode} run"}))
    return {"traceEvents": meta + out, "displayTimeUnit": "ms"}


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
