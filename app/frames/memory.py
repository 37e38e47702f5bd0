"""Memory events (docs/events.md) -> frames: the within-step curve of a traced step, peaks, and
the timer's readings over the whole run (`memory_over_run_frame`, from `memory_readings` events).

A `memory` event is one device in one traced step; its `curve` holds, per source, points of
``[seconds from the step's start, bytes]``. Sources and what they measure:

- ``tensors``: bytes of the tensor storages this device holds (the engine's live-tensor ledger);
- ``cuda``: PyTorch's CUDA caching allocator (`memory_allocated`) of this GPU;
- ``nvml``: NVML's used memory of the same physical GPU (every process on it);
- ``process``: resident memory of the process (psutil); DP's virtual devices share one process.
"""

from __future__ import annotations

from typing import Any, Iterable

import pandas as pd

from ddpviz.app.frames.base import MIB, of_type
from ddpviz.engine.analysis import format_bytes

Event = dict[str, Any]
SOURCE_LABELS = {"tensors": "tensors (live-tensor ledger)",
                 "cuda": "cuda allocator", "nvml": "nvml (whole GPU)", "process": "process RSS (psutil)"}
DEVICE_SOURCES = ("tensors", "cuda")  # what one device holds
HOST_SOURCES = ("process", "nvml")  # the whole process / the whole GPU
SHARED_PROCESS = "all devices (one process)"
TIMER_NOTES = {"cuda": "torch.cuda.memory_allocated of each GPU", "nvml": "NVML used memory of each whole GPU",
               "process": "psutil RSS of the process that runs each device (DP's devices share one)"}
CURVE_COLUMNS = ["run", "step", "device", "source", "source_label", "t_ms", "mib"]
PEAK_COLUMNS = ["run", "step", "device", "source", "peak_mib", "allocated_mib", "floor_mib", "training_mib"]
RUN_MEMORY_COLUMNS = ["run", "device", "source", "source_label", "t_s", "mib", "lo_mib", "hi_mib",
                      "readings", "bin_s"]


def latest_traced_step(events: Iterable[Event]) -> int | None:
    """Newest step whose `memory` events came from every device seen so far (DDP ranks report
    separately, so the newest step may be half there); the newest step seen otherwise."""
    evs = of_type(events, "memory")
    if not evs:
        return None
    devices = {_who(e) for e in evs}
    by_step: dict[int, set] = {}
    for e in evs:
        by_step.setdefault(e["step"], set()).add(_who(e))
    done = [s for s, seen in by_step.items() if seen == devices]
    return max(done) if done else max(by_step)


def _who(e: Event) -> tuple:
    return (e.get("host"), e.get("rank", 0), e.get("device"))


def memory_curve_frame(events: Iterable[Event], run: str, step: int | None = None) -> pd.DataFrame:
    """Every source's points in one traced step (default: `latest_traced_step`), in MiB and ms
    from the step's start. A process shared by DP's devices appears once, as `SHARED_PROCESS`."""
    events = list(events)
    step = latest_traced_step(events) if step is None else step
    rows: list[dict[str, Any]] = []
    shared_done = False
    for e in of_type(events, "memory"):
        if e.get("step") != step:
            continue
        curve = e.get("curve")
        if curve is None and e.get("allocated_bytes") is not None:  # a one-off reading, no curve
            curve = {e.get("source", "?"): [[0.0, e["allocated_bytes"]]]}
        for src, pts in (curve or {}).items():
            device = e.get("device", "?")
            if src == "process" and e.get("process_shared"):
                if shared_done:
                    continue
                device, shared_done = SHARED_PROCESS, True
            rows += [{"run": run, "step": step, "device": device, "source": src,
                      "source_label": SOURCE_LABELS.get(src, src), "t_ms": t * 1000.0,
                      "mib": b / MIB} for t, b in pts]
    return pd.DataFrame(rows, columns=CURVE_COLUMNS)


def memory_peak_frame(events: Iterable[Event], run: str) -> pd.DataFrame:
    """One row per traced step and device: the measured peak, the bytes held at the step's end and,
    on CUDA, the peak's two parts (`library_floor_bytes`: cuBLAS workspaces and the like, held
    before the step began; `peak_training_bytes`: the rest; NaN where the event has none)."""
    rows = [{"run": run, "step": e.get("step"), "device": e.get("device", "?"),
             "source": e.get("source", "?"),
             "peak_mib": _mib(e.get("peak_allocated_bytes", e.get("allocated_bytes"))),
             "allocated_mib": _mib(e.get("allocated_bytes")),
             "floor_mib": _mib(e.get("library_floor_bytes")),
             "training_mib": _mib(e.get("peak_training_bytes"))} for e in of_type(events, "memory")]
    return pd.DataFrame(rows, columns=PEAK_COLUMNS)


def _mib(nbytes: float | None) -> float:
    return float("nan") if nbytes is None else nbytes / MIB


def peak_caption(peaks: pd.DataFrame) -> str | None:
    """"peak X on D; imbalance max/min Y×" over the devices' measured peaks (X in the unit
    `engine.analysis.format_bytes` picks), or None."""
    src = ", ".join(sorted(SOURCE_LABELS.get(s, s) for s in set(peaks["source"])))
    if peaks["training_mib"].notna().any() and peaks.dropna(subset=["training_mib"])["device"].nunique() \
            == peaks["device"].nunique():  # CUDA: the library's floor held apart (issue 31)
        later = peaks[peaks["step"].fillna(0) >= 1]  # step 0 makes the workspaces inside it
        use = later if later["device"].nunique() == peaks["device"].nunique() else peaks
        per = use.groupby("device")["training_mib"].max()
        floor = peaks.groupby("device")["floor_mib"].max()
        if per.min() <= 0:
            return None
        imbalance = (f"; imbalance of the training's peaks max/min {per.max() / per.min():.2f}×"
                     if len(per) > 1 else "")
        return (f"the training's measured peak {format_bytes(per.max() * MIB)} on {per.idxmax()}, above a "
                f"library floor of {format_bytes(floor.max() * MIB)} (cuBLAS workspaces and the like, held "
                f"before the step began: in the allocator's peak, not the training's){imbalance} ({src}, "
                f"over the traced steps shown)")
    per = peaks.dropna(subset=["peak_mib"]).groupby("device")["peak_mib"].max()
    if len(per) < 2 or per.min() <= 0:
        return None
    return (f"measured peak {format_bytes(per.max() * MIB)} on {per.idxmax()}; imbalance max/min "
            f"{per.max() / per.min():.2f}× ({src}, over the traced steps shown)")


def memory_phase_frame(events: Iterable[Event], step: int | None) -> pd.DataFrame:
    """Where the phases of `step` fall, ms from the step's start, on device 0 / rank 0: the
    `phases` its `memory` event carries (DP: the measured phase spans; DDP and single: placed
    from the step's measured durations), else the same from `dp_phase` or `step` events."""
    cols = ["phase", "start_ms", "end_ms"]
    events = list(events)
    mem = sorted((e for e in of_type(events, "memory") if e.get("step") == step and e.get("phases")),
                 key=lambda e: (e.get("rank", 0), str(e.get("device"))))
    if mem:
        return pd.DataFrame([{"phase": p, "start_ms": a * 1000.0, "end_ms": b * 1000.0}
                             for p, a, b in mem[0]["phases"]], columns=cols)
    dp = [e for e in of_type(events, "dp_phase") if e.get("step") == step]
    if dp:
        first = min(e.get("device", "") for e in dp)
        return pd.DataFrame([{"phase": e["phase"], "start_ms": e["start_s"] * 1000.0,
                              "end_ms": e["end_s"] * 1000.0} for e in dp if e.get("device") == first],
                            columns=cols)
    st = [e for e in of_type(events, "step") if e.get("step") == step and e.get("rank", 0) == 0]
    if not st:
        return pd.DataFrame(columns=cols)
    e = st[0]
    bwd_at = (e["backward_start_ts"] - e["start_ts"] if e.get("backward_start_ts") and e.get("start_ts")
              else e.get("forward_s") or 0.0)
    bwd_end = bwd_at + e.get("backward_s", 0.0) + (e.get("comm_exposed_s") or 0.0)
    total = e.get("step_time_s", bwd_end)
    spans = [("forward", bwd_at - (e.get("forward_s") or 0.0), bwd_at), ("backward", bwd_at, bwd_end),
             ("optimizer", total - e.get("optimizer_s", 0.0), total)]
    return pd.DataFrame([{"phase": p, "start_ms": a * 1000.0, "end_ms": b * 1000.0}
                         for p, a, b in spans], columns=cols)


def memory_over_run_frame(bins: list[dict[str, Any]], run: str, origin_ts: float | None = None) -> pd.DataFrame:
    """The memory timer's readings over a whole run, one row per time bin, device and source.

    Args:
        bins: `app.step_history.ReadingHistory.rows()` (unix s, bytes).
        run: the run's label.
        origin_ts: unix s of t = 0 (the run's start); default the first reading. A reading before
            it (an attached run's rank 0 says `run_started` after its first step, when its timer
            already ran) moves t = 0 back to that reading, so the axis starts at 0, never below.

    Returns:
        RUN_MEMORY_COLUMNS: t_s (seconds from `origin_ts` to the middle of the bin's readings),
        mib (their mean), lo_mib / hi_mib (their min and max), readings (how many), bin_s
        (the bins' width), source_label (`SOURCE_LABELS`), sorted by device, source, time. `device` is
        "host/device" only where the readings come from more than one host, as the other charts name them.
    """
    if not bins:
        return pd.DataFrame(columns=RUN_MEMORY_COLUMNS)
    df = pd.DataFrame(bins)
    hosts = {d.split("/", 1)[0] if "/" in d else None for d in df["device"]}
    if len(hosts) == 1 and None not in hosts:  # one host: its name only on this chart read "vm/cpu:0" beside
        df["device"] = df["device"].str.split("/", n=1).str[1]  # every other chart's "cpu:0" (2026-12-06)
    first = float(df["first_ts"].min())
    origin = min(origin_ts, first) if origin_ts is not None else first
    out = pd.DataFrame({
        "run": run, "device": df["device"], "source": df["source"],
        "source_label": df["source"].map(lambda s: SOURCE_LABELS.get(s, s)),
        "t_s": (df["first_ts"] + df["last_ts"]) / 2 - origin,
        "mib": df["mean_bytes"] / MIB, "lo_mib": df["lo_bytes"] / MIB, "hi_mib": df["hi_bytes"] / MIB,
        "readings": df["readings"], "bin_s": df["bin_s"]})
    return out.sort_values(["device", "source", "t_s"]).reset_index(drop=True)[RUN_MEMORY_COLUMNS]
