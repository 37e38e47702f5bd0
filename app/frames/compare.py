"""Pure transforms for the Compare page: one row of measures per run, and per-device tables.

Input per run is a `RunView`: its label, record and the events an analysis window kept.
Numbers come from the run's summary once it has finished (the engine's medians after warm-up),
else from the events seen so far, so a running pair fills the table as it goes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import pandas as pd

from ddpviz.app.frames import base as frames
from ddpviz.app.frames import steps as fsteps
from ddpviz.app.frames.steps import THEORY, volume_label
from ddpviz.engine.analysis import theory_bytes
from ddpviz.engine.summary import COMM_NOT_MEASURED, FSDP_HOST_BLOCKING

MIB = frames.MIB


@dataclass
class RunView:
    """What the pure functions need of one run (built from a `RunWindow` by the pages)."""

    label: str
    record: dict[str, Any]
    events: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    started: dict[str, Any] | None = None
    finished: dict[str, Any] | None = None

    @property
    def config(self) -> dict[str, Any]:
        return self.record.get("config") or (self.started or {}).get("config") or {}

    @property
    def mode(self) -> str:
        return self.config.get("mode", "?")

    @property
    def world_size(self) -> int:
        return int(frames.devices_used(self.config) or 1)

    @property
    def summary(self) -> dict[str, Any]:
        return self.record.get("summary") or (self.finished or {}).get("summary") or {}

    def of_type(self, type_: str) -> list[dict[str, Any]]:
        return self.events.get(type_, [])

    @cached_property
    def steps(self) -> pd.DataFrame:
        """`app.frames.steps.steps_frame` of the run's step events, built once per view (the table and the
        curves both read it; a view is made afresh for each drawing, so it is never stale).
        Read-only: callers filter or copy it."""
        return fsteps.steps_frame(self.of_type("step"), self.label)


def view_of(window, label: str) -> RunView:
    """A `RunView` of an `app.window.RunWindow`."""
    return RunView(label=label, record=window.run or {}, events=window.events,
                   started=window.started, finished=window.finished)


COMPARE_COLUMNS = ["run", "mode", "world_size", "status", "samples_per_s", "speedup_vs_single",
                   "step_time_ms", "forward_ms", "backward_ms", "comm_exposed_ms", "dp_copies_ms", "comm_exposed_note",
                   "optimizer_ms", "overlap", "overlap_note", "peak_mib_max", "peak_mib_min", "memory_imbalance",
                   "bytes_mib_max", "bytes_source", "theory_mib_max", "replicas_in_sync", "replicas",
                   "final_loss"]


def compare_frame(views: list[RunView]) -> pd.DataFrame:
    """One row per run with the measures of `COMPARE_COLUMNS` (ms, MiB, samples/s).

    `speedup_vs_single` = samples_per_s / samples_per_s of the set's single run (NaN without one);
    `memory_imbalance` = max / min measured peak memory over the run's devices; `bytes_mib_max`
    is the busiest device's sent + received MiB per step (`bytes_source`: its `volume_label`,
    measured for DP's copies, derived for DDP's ring and FSDP's collectives, unlabelled without a
    source), `theory_mib_max` the formula's; `replicas` says in words
    what the replica check shows (`replica_verdict`).
    """
    rows = [_row(v) for v in views]
    df = pd.DataFrame(rows, columns=COMPARE_COLUMNS)
    single = df.loc[df["mode"] == "single", "samples_per_s"].dropna()
    base = float(single.iloc[0]) if len(single) else float("nan")
    df["speedup_vs_single"] = df["samples_per_s"] / base if base > 0 else float("nan")
    return df


def _row(v: RunView) -> dict[str, Any]:
    s = v.summary
    steps = v.steps
    late = steps[steps["step"] >= 1] if len(steps) > 1 else steps
    med = late.median(numeric_only=True) if not late.empty else pd.Series(dtype=float)

    def pick(key_s: str, col_ms: str) -> float:
        if s.get(key_s) is not None:
            return float(s[key_s]) * 1000.0
        return float(med.get(col_ms, float("nan")))

    peaks = peak_memory_frame([v])
    vol = bytes_frame([v])
    return {
        "run": v.label, "mode": v.mode, "world_size": v.world_size,
        "status": v.record.get("status"),
        "samples_per_s": float(s["samples_per_s"]) if s.get("samples_per_s") else
        float(med.get("samples_per_s", float("nan"))),
        "speedup_vs_single": float("nan"),
        "step_time_ms": pick("step_time_s", "step_time_ms"),
        "forward_ms": pick("forward_s", "forward_ms"),
        "backward_ms": pick("backward_s", "backward_ms"),
        # DP's `comm_exposed_s` is its copies through device 0 (`fsteps.DP_COPIES`), never exposed comm; a
        # single device communicates with nobody (its 0 is a constant, engine/modes/single.py): "—", not "0.00"
        "comm_exposed_ms": float("nan") if v.mode in ("dp", "single") else pick("comm_exposed_s", "comm_exposed_ms"),
        "dp_copies_ms": pick("comm_exposed_s", "comm_exposed_ms") if v.mode == "dp" else float("nan"),
        "comm_exposed_note": s.get("comm_exposed_note") or fsteps.unmeasured_parts(steps).get(v.label),
        "optimizer_ms": pick("optimizer_s", "optimizer_ms"),
        "overlap": s.get("overlap") if v.mode in ("ddp", "fsdp") else None,
        "overlap_note": s.get("overlap_note") if v.mode in ("ddp", "fsdp") else None,
        "peak_mib_max": peaks["peak_mib"].max() if not peaks.empty else float("nan"),
        "peak_mib_min": peaks["peak_mib"].min() if not peaks.empty else float("nan"),
        "memory_imbalance": (peaks["peak_mib"].max() / peaks["peak_mib"].min()
                             if not peaks.empty and peaks["peak_mib"].min() > 0 else float("nan")),
        "bytes_mib_max": vol.loc[vol["which"] != THEORY, "mib"].max() if not vol.empty
        else float("nan"),
        "bytes_source": next(iter(vol.loc[vol["which"] != THEORY, "which"]), None),
        "theory_mib_max": vol.loc[vol["which"] == THEORY, "mib"].max() if not vol.empty
        else float("nan"),
        "replicas_in_sync": replicas_in_sync(v),
        "replicas": replica_verdict(v),
        "final_loss": s.get("final_loss") if s.get("final_loss") is not None else
        (float(steps["loss"].iloc[-1]) if not steps.empty else None),
    }


def replicas_in_sync(v: RunView) -> bool | None:
    """The summary's verdict, else the latest `sync` event's (None before any check, and for a
    single device, which has nothing to compare)."""
    if v.summary.get("replicas_in_sync") is not None:
        return bool(v.summary["replicas_in_sync"])
    syncs = v.of_type("sync")
    got = syncs[-1].get("in_sync") if syncs else None
    return None if got is None else bool(got)


def replica_verdict(v: RunView) -> str:
    """What the replica check shows, in words: DDP compares every rank's parameters after the
    step; DP keeps one master copy on device 0 and rebuilds its replicas every step, checked as
    they computed (after the step's forward and backward), and names the buffer updates its
    replicas made and it discarded (`buffers_discarded`); a single device has nothing to compare."""
    if v.mode == "single":
        return "n/a (one device)"
    ok = replicas_in_sync(v)
    said = "—" if ok is None else ("yes" if ok else "NO")
    if v.mode == "dp":
        syncs = v.of_type("sync")
        lost = v.summary.get("buffers_discarded", syncs[-1].get("buffers_discarded") if syncs else None)
        extra = f"; discards buffer updates made on replicas: {lost} buffer(s)" if lost else ""
        return f"rebuilt each step; as computed with: {said}{extra}"
    return said


def buffers_frame(views: list[RunView]) -> pd.DataFrame:
    """Module buffers per rank at the last check of each DDP run (its `sync` event's `buffers`):
    columns run, step, buffer, rank, at_forward_start, after_step (Σ of the buffer's values), and
    `as_rank0_at_forward` (the rank's buffer equals rank 0's as the forward started, i.e. DDP
    broadcast it). Empty when no DDP run has buffers."""
    cols = ["run", "step", "buffer", "rank", "at_forward_start", "after_step", "as_rank0_at_forward"]
    rows = []
    for v in views:
        syncs = [e for e in v.of_type("sync") if e.get("buffers")]
        if v.mode != "ddp" or not syncs:
            continue
        last = syncs[-1]
        r0 = {b["name"]: b["at_forward_start"] for b in last["buffers"] if b["rank"] == 0}
        rows += [{"run": v.label, "step": last["step"], "buffer": b["name"], "rank": b["rank"],
                  "at_forward_start": b["at_forward_start"][0], "after_step": b["after_step"][0],
                  "as_rank0_at_forward": b["at_forward_start"] == r0.get(b["name"])}
                 for b in last["buffers"]]
    return pd.DataFrame(rows, columns=cols)


def peak_memory_frame(views: list[RunView]) -> pd.DataFrame:
    """Peak memory per device per run (MiB): columns run, device, peak_mib.

    The max over memory events of `peak_allocated_bytes` (else `allocated_bytes`), devices named
    as in `bytes_frame`; the summary's `peak_memory_bytes` when no memory event was kept."""
    rows = []
    for v in views:
        peaks: dict[str, float] = {}
        for e in v.of_type("memory"):
            b = e.get("peak_allocated_bytes") or e.get("allocated_bytes") or 0
            where = _where(v, e)
            peaks[where] = max(peaks.get(where, 0), b)
        if not peaks:
            peaks = dict(v.summary.get("peak_memory_bytes") or {})
        rows += [{"run": v.label, "device": d, "peak_mib": b / MIB} for d, b in sorted(peaks.items())]
    return pd.DataFrame(rows, columns=["run", "device", "peak_mib"])


def bytes_frame(views: list[RunView]) -> pd.DataFrame:
    """Sent + received MiB per device per step, measured or derived, and by formula.

    Columns: run, device, which (one of `app.frames.steps.VOLUME_KINDS`), mib. From the latest
    `comm_volume` events (or the summary's `bytes_per_device`), labelled by their own
    `volume_source` (`app.frames.steps.volume_label`; `UNLABELLED` without one): DP's are the
    bytes of the tensors it copied (measured); DDP's are the bytes it handed to all-reduce times
    the ring factor (derived); FSDP's are the bytes of its all-gathers and reduce-scatters times
    the backend's wire factor (derived). Theory:
    `engine.analysis.theory_bytes` with P = the run's gradient bytes (`run_started.grad_bytes`),
    sent and received each; FSDP: the `theory_sent_bytes` its events carry (3(n−1)/n·P with
    reshard, 2(n−1)/n·P without).
    """
    rows = []
    for v in views:
        vols = v.of_type("comm_volume")
        if vols:
            got = {_where(v, e): e for e in frames.latest_volumes(vols)}
        else:  # summary keys are device names
            got = dict(v.summary.get("bytes_per_device") or {})
        rows += [{"run": v.label, "device": d, "which": volume_label(e.get("volume_source")),
                  "mib": ((e.get("sent_bytes") or 0) + (e.get("recv_bytes") or 0)) / MIB}
                 for d, e in sorted(got.items())]
        if v.mode == "fsdp" and vols:  # its own formula, carried by its comm_volume events
            rows += [{"run": v.label, "device": d, "which": THEORY,
                      "mib": 2 * (e.get("theory_sent_bytes") or 0) / MIB} for d, e in sorted(got.items())]
        grad = (v.started or {}).get("grad_bytes")
        if grad and v.mode in ("dp", "ddp"):
            theory = theory_bytes(v.mode, v.world_size, int(grad))
            rows += [{"run": v.label, "device": _where_index(v, i), "which": THEORY,
                      "mib": 2 * b / MIB} for i, b in sorted(theory.items())]
    return pd.DataFrame(rows, columns=["run", "device", "which", "mib"])


def _where(v: RunView, e: dict[str, Any]) -> str:
    """Where an event happened: the device for DP and single, ``rank r`` for DDP (device names
    repeat across hosts)."""
    return f"rank {e.get('rank', 0)}" if v.mode in ("ddp", "fsdp") else str(e.get("device", "?"))


def _where_index(v: RunView, i: int) -> str:
    if v.mode in ("ddp", "fsdp"):
        return f"rank {i}"
    names = (v.started or {}).get("device_names") or []
    return names[i] if i < len(names) else f"device {i}"


def curves_frame(views: list[RunView], max_points: int = 700) -> pd.DataFrame:
    """`app.frames.steps.steps_frame` of every run on one step axis, each thinned to `max_points` rows."""
    parts = [thin(v.steps, max_points) for v in views]
    parts = [p for p in parts if not p.empty]
    return pd.concat(parts, ignore_index=True) if parts else fsteps.steps_frame([], "")


def thin(df: pd.DataFrame, max_rows: int) -> pd.DataFrame:
    """Every k-th row so at most `max_rows` remain (the last row always kept)."""
    if len(df) <= max_rows:
        return df
    k = -(-len(df) // max_rows)
    keep = df.iloc[::k]
    if keep.index[-1] != df.index[-1]:
        keep = pd.concat([keep.iloc[:-1], df.iloc[[-1]]])
    return keep.reset_index(drop=True)


TABLE_ROWS = [  # (row title, column, format)
    ("samples/s (median)", "samples_per_s", "{:,.0f}"),
    ("speed-up vs single", "speedup_vs_single", "{:.2f}×"),
    ("step time (ms; it and its parts: medians of steady steps)", "step_time_ms", "{:.2f}"),
    ("  forward (ms)", "forward_ms", "{:.2f}"),
    ("  backward (ms)", "backward_ms", "{:.2f}"),
    ("  exposed comm (ms)", "comm_exposed_ms", "{:.2f}"),
    (f"  {fsteps.DP_COPIES} (ms)", "dp_copies_ms", "{:.2f}"),
    ("  optimizer (ms)", "optimizer_ms", "{:.2f}"),
    ("overlap (1 − exposed / total comm)", "overlap", "{:.0%}"),
    ("peak memory, busiest device (MiB)", "peak_mib_max", "{:.3f}"),
    ("memory imbalance (max / min)", "memory_imbalance", "{:.2f}×"),
    ("bytes/step, busiest device (MiB)", "bytes_mib_max", "{:.3f}"),
    ("  how it is known", "bytes_source", "{}"),
    ("  formula (MiB)", "theory_mib_max", "{:.3f}"),
    ("replicas in sync", "replicas", "{}"),
    ("final loss", "final_loss", "{:.4f}"),
]


# the table's cell where the summary gives `overlap_note` (its whole text is in the verdict above the table)
OVERLAP_SHORT = "not measured (all-reduce spans on profiled steps only: bucket_timing=recorder)"


def side_by_side(df: pd.DataFrame) -> pd.DataFrame:
    """`compare_frame` turned for reading: one row per measure, one column per run (strings)."""
    out = {"measure": [t for t, _, _ in TABLE_ROWS]}
    for _, r in df.iterrows():
        out[r["run"]] = [_fmt(r[c], f) for _, c, f in TABLE_ROWS]
        if r.get("comm_exposed_note"):  # not measured: the reason, never a number
            out[r["run"]][[c for _, c, _ in TABLE_ROWS].index("comm_exposed_ms")] = COMM_NOT_MEASURED
        if isinstance(r.get("overlap_note"), str):  # the summary's reason (bucket_timing=recorder), never a dash
            out[r["run"]][[c for _, c, _ in TABLE_ROWS].index("overlap")] = OVERLAP_SHORT
        elif r["mode"] == "fsdp" and _fmt(r["overlap"], "{}") != "—":  # measured only on the host clock: CPU
            out[r["run"]][[c for _, c, _ in TABLE_ROWS].index("overlap")] = \
                f"{r['overlap']:.0%} (by construction on CPU: {FSDP_HOST_BLOCKING})"
    return pd.DataFrame(out)


def _fmt(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "—"
    if isinstance(value, bool) or fmt == "{}":
        return {True: "yes", False: "NO"}.get(value, str(value))
    return fmt.format(value)
