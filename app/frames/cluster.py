"""Pure transforms for the Cluster page: workers, their GPUs, and what each worker ran.

Worker dicts are `DdpvizClient.workers()`'s: ``{name, host, pid, devices, ts, current_run,
state}`` plus, where the worker sees NVIDIA GPUs, ``gpus: [{index, name, memory_used_bytes,
memory_total_bytes, utilization_pct}]`` (from NVML, refreshed with each heartbeat).
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Iterable

import pandas as pd

GIB = 1024 ** 3
WORKER_COLUMNS = ["name", "host", "pid", "state", "current_run", "heartbeat_age_s", "devices",
                  "gpus"]


def devices_text(devices: Iterable[Any]) -> str:
    """A worker's devices (`workers.heartbeat.detect_devices`'s list) in words: the CPU with its cores, then its
    GPUs counted by name, e.g. "CPU (16 cores) + 8 × NVIDIA H100". The CPU is one device whatever the world size:
    on a host without GPUs, a run's gloo ranks are processes that share its cores, so "1 × cpu" beside a
    2-rank run read as a missing device. "none reported" for an empty list."""
    parts, gpus = [], {}
    for d in devices:
        if not isinstance(d, dict):
            continue
        if d.get("kind") == "cpu":
            parts.append(f"CPU ({d['cores']} cores)" if d.get("cores") else "CPU")
        else:
            name = str(d.get("name") or d.get("kind") or "?")
            gpus[name] = gpus.get(name, 0) + 1
    parts += [f"{n} × {name}" for name, n in gpus.items()]
    return " + ".join(parts) or "none reported"


def workers_frame(workers: Iterable[dict[str, Any]], now: float,
                  labels: dict[str, str] | None = None) -> pd.DataFrame:
    """One row per worker; `heartbeat_age_s` = now − last beat; `devices` in words (`devices_text`);
    `gpus` "CPU only" when the worker reported none; `current_run` its runs as "label (id)" where `labels`
    (run id -> label) knows them (a pair in turns is two ids: a new user saw "44bb…,ed8a…")."""
    rows, names = [], labels or {}
    for w in workers:
        gpus = w.get("gpus") or []
        rows.append({
            "name": w.get("name"), "host": w.get("host"), "pid": w.get("pid"),
            "state": w.get("state") or "?", "current_run": ", ".join(
                f"{names[r]} ({r[:8]})" if names.get(r) else r
                for r in str(w.get("current_run") or "").split(",") if r),
            "heartbeat_age_s": max(0.0, now - float(w["ts"])) if w.get("ts") else None,
            "devices": devices_text(w.get("devices") or []),
            "gpus": ", ".join(f"{g.get('index')}: {g.get('name')}" for g in gpus) or "CPU only"})
    return pd.DataFrame(rows, columns=WORKER_COLUMNS)


def gpu_frame(workers: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """One row per GPU of every worker: worker, gpu (label), used_gib, total_gib, used_pct,
    utilization_pct."""
    cols = ["worker", "gpu", "used_gib", "total_gib", "used_pct", "utilization_pct"]
    rows = []
    for w in workers:
        for g in w.get("gpus") or []:
            used, total = g.get("memory_used_bytes") or 0, g.get("memory_total_bytes") or 0
            rows.append({"worker": w.get("name"),
                         "gpu": f"{w.get('name')} · GPU {g.get('index')} ({g.get('name')})",
                         "used_gib": used / GIB, "total_gib": total / GIB,
                         "used_pct": 100.0 * used / total if total else None,
                         "utilization_pct": g.get("utilization_pct")})
    return pd.DataFrame(rows, columns=cols)


def worker_runs_frame(runs: Iterable[dict[str, Any]], now: float, since: float | None = None) -> pd.DataFrame:
    """Runs that a worker started: worker, run (label · id), mode, status, start, end (local
    datetimes; a running run ends now), and `slot`: 0 for a run that overlaps none before it on its
    worker, else the lowest slot free at its start (a DP+DDP pair trains at once: slots 0 and 1), so the
    chart stacks only runs that ran at the same time. With `since` (epoch s), only runs that were still
    running at that moment or started after it: the time axis spans the window, not the whole history."""
    cols = ["worker", "run", "mode", "status", "start", "end", "slot"]
    rows = []
    for r in runs:
        if not r.get("worker") or not r.get("started_at"):
            continue
        label = r.get("label") or (r.get("config") or {}).get("mode", "?")
        end = r.get("finished_at") or now
        if since is not None and end < since:
            continue
        rows.append({"worker": r["worker"], "run": f"{label} · {r['run_id'][:6]}",
                     "mode": (r.get("config") or {}).get("mode"), "status": r.get("status"),
                     "start": dt.datetime.fromtimestamp(r["started_at"]),
                     "end": dt.datetime.fromtimestamp(max(end, r["started_at"])), "slot": 0})
    busy: dict[Any, list] = {}  # per worker, each slot's latest end
    for row in sorted(rows, key=lambda x: x["start"]):
        ends = busy.setdefault(row["worker"], [])
        row["slot"] = next((i for i, e in enumerate(ends) if e <= row["start"]), len(ends))
        ends[row["slot"]:row["slot"] + 1] = [row["end"]]
    return pd.DataFrame(rows, columns=cols)


def runs_axis(runs: pd.DataFrame, now: float, window_s: float) -> tuple[dt.datetime, dt.datetime]:
    """The runs chart's time axis for a window of `window_s` seconds up to `now`: from the window's start, or
    from just before the first run drawn where that is later (a pad of 5% of what is shown, at least 10 s), to
    now. Runs of the last 3 minutes in a 1-hour window were a sliver at its right edge (seen 2026-12-06)."""
    end = dt.datetime.fromtimestamp(now)
    start = dt.datetime.fromtimestamp(now - window_s)
    if not runs.empty:
        first = min(runs["start"].min(), end)
        pad = max((end - first) * 0.05, dt.timedelta(seconds=10))
        start = max(start, first - pad)
    return start, end
