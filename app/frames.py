"""Pure transforms: lists of run events (docs/events.md) -> pandas DataFrames the charts draw.

Every function takes plain event dicts and returns a DataFrame with unit-named columns
(`*_ms` milliseconds, `*_mib` MiB, `samples_per_s` samples per second). No Streamlit, no I/O.
An empty input gives an empty frame with the same columns, so charts never see missing fields.
"""

from __future__ import annotations

from typing import Any, Iterable

import pandas as pd

from engine.stages import where_failed
from engine.summary import WARMUP_STEPS

MIB = 1024 * 1024
Event = dict[str, Any]

STEP_COLUMNS = ["run", "step", "samples", "samples_per_s", "samples_per_s_smooth", "step_time_ms",
                "forward_ms", "backward_ms", "comm_exposed_ms", "optimizer_ms", "loss", "instrument"]
SMOOTH_STEPS = 9  # rolling-median window of `samples_per_s_smooth`, steps
_STEP_PARTS = {"forward_ms": "forward_s", "backward_ms": "backward_s",
               "comm_exposed_ms": "comm_exposed_s", "optimizer_ms": "optimizer_s"}
SPLIT_PARTS = ["forward", "backward", "exposed comm", "optimizer", "other"]
DP_PHASES = ["broadcast", "scatter", "forward", "gather", "loss", "backward", "reduce", "optimizer"]


def of_type(events: Iterable[Event], type_: str) -> list[Event]:
    """The events whose `type` is `type_`, in order."""
    return [e for e in events if e.get("type") == type_]


def run_label(run: dict[str, Any] | None, run_id: str) -> str:
    """Short legend name of a run: its label if set, else ``"<mode> ×<world_size> · <id[:6]>"``."""
    run = run or {}
    if run.get("label"):
        return str(run["label"])
    cfg = run.get("config") or {}
    mode, ws = cfg.get("mode", "?"), cfg.get("world_size", "?")
    return f"{mode} ×{ws} · {run_id[:6]}"


def steps_frame(events: Iterable[Event], run: str) -> pd.DataFrame:
    """One row per optimizer step of one run (times in ms).

    DDP emits a `step` event per rank; `step_time_ms` is the mean over ranks, `samples_per_s` =
    samples / that time, and the parts (forward, backward, exposed comm, optimizer) are the mean
    over ranks too. Each rank's step time already includes its wait for the others at the
    all-reduce, and runs from its own previous step's end, so every rank's times add up to the
    run's wall time; a rank that starts a step late measures it shorter. The max over ranks
    would add half the step-to-step change of the ranks' skew to every step (up to 15% of a
    default CPU step here, which made DDP look slower than DP on Live while the runs' own
    summaries said the opposite).
    """
    rows = [{"step": e["step"], "rank": e.get("rank", 0), "samples": e.get("samples", 0),
             "step_time_s": e.get("step_time_s", 0.0), "loss": e.get("loss"),
             "instrument": bool(e.get("memory_traced") or e.get("replica_check")),
             **{s: e.get(s, 0.0) for s in _STEP_PARTS.values()}}
            for e in of_type(events, "step")]
    if not rows:
        return pd.DataFrame(columns=STEP_COLUMNS)
    df = pd.DataFrame(rows)
    agg = {"samples": "max", "step_time_s": "mean", "loss": "mean", "instrument": "max",
           **{s: "mean" for s in _STEP_PARTS.values()}}
    g = df.groupby("step", as_index=False).agg(agg).sort_values("step")
    out = pd.DataFrame({"run": run, "step": g["step"].astype(int), "samples": g["samples"]})
    step_s = g["step_time_s"].where(g["step_time_s"] > 0)
    out["samples_per_s"] = g["samples"] / step_s
    out["samples_per_s_smooth"] = out["samples_per_s"].rolling(SMOOTH_STEPS, min_periods=1).median()
    out["step_time_ms"] = g["step_time_s"] * 1000.0
    for col, src in _STEP_PARTS.items():
        out[col] = g[src] * 1000.0
    out["loss"] = g["loss"]
    out["instrument"] = g["instrument"].astype(bool)
    return out.reset_index(drop=True)[STEP_COLUMNS]


def steady_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """The rows of each run that its medians use, by the run summary's own rule
    (`engine.summary`): the first `WARMUP_STEPS` steps skipped (fewer for short runs), and the
    steps whose time includes the instrument's own work (`instrument`: memory tracing, DP's
    replica checksums) left out while at least half the steps remain."""
    parts = []
    for _, df in steps.groupby("run", sort=False):
        df = df.sort_values("step")
        late = df.iloc[min(WARMUP_STEPS, len(df) // 4):]
        late = late if not late.empty else df
        plain = late[~late["instrument"].astype(bool)]
        parts.append(plain if 2 * len(plain) >= len(late) else late)
    return pd.concat(parts, ignore_index=True) if parts else steps


def split_frame(steps: pd.DataFrame, warmup_steps: int = 1) -> pd.DataFrame:
    """Median step-time split per run: columns run, part, ms, order.

    `steps` is `steps_frame` output (one or several runs). Steps below `warmup_steps` are dropped
    when later steps exist (step 0 builds buckets and warms caches). `other` is the step time the
    four parts do not cover (data loading, synchronisation), clipped at 0.
    """
    cols = ["run", "part", "ms", "order"]
    if steps.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for run, df in steps.groupby("run", sort=False):
        late = df[df["step"] >= warmup_steps]
        med = (late if not late.empty else df).median(numeric_only=True)
        parts = [med["forward_ms"], med["backward_ms"], med["comm_exposed_ms"], med["optimizer_ms"]]
        parts.append(max(0.0, med["step_time_ms"] - sum(parts)))
        rows += [{"run": run, "part": p, "ms": float(v), "order": i}
                 for i, (p, v) in enumerate(zip(SPLIT_PARTS, parts))]
    return pd.DataFrame(rows, columns=cols)


def _mib(nbytes: float | None) -> float:
    return float("nan") if nbytes is None else nbytes / MIB


def latest_complete_step(events: Iterable[Event], type_: str) -> int | None:
    """Newest step whose `type_` events look complete for every rank/device seen in it.

    Events arrive in batches, so the newest step may be half there. A `bucket` step is complete
    when each of its ranks has sent its `is_last` bucket; a `dp_phase` step when each device has
    sent its `optimizer` phase (device 0 only steps in DP, so: when any device has). Falls back to
    the newest step seen when none is complete.
    """
    evs = of_type(events, type_)
    if not evs:
        return None
    by_step: dict[int, list[Event]] = {}
    for e in evs:
        by_step.setdefault(e["step"], []).append(e)
    for step in sorted(by_step, reverse=True):
        if _complete(by_step[step], type_):
            return step
    return max(by_step)


def _complete(evs: list[Event], type_: str) -> bool:
    if type_ == "bucket":
        ranks = {e.get("rank", 0) for e in evs}
        done = {e.get("rank", 0) for e in evs if e.get("is_last")}
        return ranks == done
    if type_ == "dp_phase":
        return any(e.get("phase") == "optimizer" for e in evs)
    return True


def bucket_frame(events: Iterable[Event], step: int | None = None) -> pd.DataFrame:
    """Buckets of one DDP step (default: the latest complete one), times in ms from backward start.

    Columns: step, rank, bucket_index, nbytes, mib, num_params, ready_ms, comm_start_ms,
    comm_end_ms, comm_ms, algbw_gbps (bytes / all-reduce time, GB/s = 1e9 B/s).
    """
    cols = ["step", "rank", "bucket_index", "nbytes", "mib", "num_params", "ready_ms",
            "comm_start_ms", "comm_end_ms", "comm_ms", "algbw_gbps"]
    events = list(events)
    step = latest_complete_step(events, "bucket") if step is None else step
    evs = [e for e in of_type(events, "bucket") if e["step"] == step]
    if not evs:
        return pd.DataFrame(columns=cols)
    df = pd.DataFrame([{
        "step": e["step"], "rank": int(e.get("rank", 0)), "bucket_index": int(e["bucket_index"]),
        "nbytes": int(e.get("nbytes", 0)), "num_params": e.get("num_params"),
        "ready_ms": e["ready_s"] * 1000.0, "comm_start_ms": e["comm_start_s"] * 1000.0,
        "comm_end_ms": e["comm_end_s"] * 1000.0} for e in evs])
    df["mib"] = df["nbytes"] / MIB
    df["comm_ms"] = df["comm_end_ms"] - df["comm_start_ms"]
    secs = (df["comm_ms"] / 1000.0).where(df["comm_ms"] > 0)
    df["algbw_gbps"] = df["nbytes"] / secs / 1e9
    return df.sort_values(["rank", "bucket_index"]).reset_index(drop=True)[cols]


def backward_frame(events: Iterable[Event], step: int) -> pd.DataFrame:
    """Backward span of each rank in `step`: rank, start_ms (0), end_ms (= backward_s)."""
    rows = [{"rank": int(e.get("rank", 0)), "start_ms": 0.0,
             "end_ms": e.get("backward_s", 0.0) * 1000.0}
            for e in of_type(events, "step") if e["step"] == step]
    return pd.DataFrame(rows, columns=["rank", "start_ms", "end_ms"])


def dp_phase_frame(events: Iterable[Event], step: int | None = None) -> pd.DataFrame:
    """DP phases of one step (default: the latest complete one), ms from the step start.

    Columns: step, device, phase, order (index in `DP_PHASES`), start_ms, end_ms, dur_ms, nbytes.
    """
    cols = ["step", "device", "phase", "order", "start_ms", "end_ms", "dur_ms", "nbytes"]
    events = list(events)
    step = latest_complete_step(events, "dp_phase") if step is None else step
    evs = [e for e in of_type(events, "dp_phase") if e["step"] == step]
    if not evs:
        return pd.DataFrame(columns=cols)
    df = pd.DataFrame([{
        "step": e["step"], "device": e.get("device", "?"), "phase": e["phase"],
        "order": DP_PHASES.index(e["phase"]) if e["phase"] in DP_PHASES else len(DP_PHASES),
        "start_ms": e["start_s"] * 1000.0, "end_ms": e["end_s"] * 1000.0,
        "nbytes": int(e.get("nbytes") or 0)} for e in evs])
    df["dur_ms"] = df["end_ms"] - df["start_ms"]
    return df.sort_values(["device", "start_ms"]).reset_index(drop=True)[cols]


UNLABELLED = "unlabelled (older run)"  # comm_volume events written before `volume_source`


def comm_volume_frame(events: Iterable[Event]) -> pd.DataFrame:
    """Bytes each device sent/received in the latest step, beside the theory, in MiB.

    `source` is the event's `volume_source` up to its first colon: "measured" (DP: the bytes of
    the tensors copied), "derived (ring all-reduce)" (DDP: bytes handed to all-reduce × 2(n−1)/n)
    or "derived (collective bytes x wire factor)" (FSDP)."""
    cols = ["device", "sent_mib", "recv_mib", "theory_sent_mib", "theory_recv_mib", "source"]
    evs = of_type(events, "comm_volume")
    if not evs:
        return pd.DataFrame(columns=cols)
    last = max(e["step"] for e in evs)
    rows = [{"device": e.get("device", "?"),
             **{c: _mib(e.get(c.replace("_mib", "_bytes"))) for c in cols[1:-1]},
             "source": (e.get("volume_source") or UNLABELLED).split(":")[0]}
            for e in evs if e["step"] == last]
    return pd.DataFrame(rows, columns=cols).sort_values("device").reset_index(drop=True)


RUN_COLUMNS = ["run_id", "label", "mode", "model", "world_size", "status", "samples_per_s",
               "note", "created", "pinned"]


def no_throughput_reason(run: dict[str, Any]) -> str:
    """Why a run has no samples/s in its summary (empty when it has one)."""
    summary = run.get("summary") or {}
    if summary.get("samples_per_s") is not None:
        return ""
    status, done = run.get("status"), int(summary.get("steps_done") or 0)
    steps = "no step" if done == 0 else f"{done} step(s)"
    if status == "queued":
        return "queued: not started yet"
    if status == "started":
        return "running: measured when it ends"
    if status == "canceled":
        return f"canceled after {steps}"
    if status == "lost":
        return "lost: its worker stopped sending heartbeats"
    if status == "failed":
        where = where_failed(run.get("error"))
        return f"failed{f' ({where})' if where else ''} after {steps}"
    return f"{status or 'unknown'}: no steps measured"


def runs_frame(runs: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """The Runs table: one row per run (newest first), `samples_per_s` from its summary (NaN
    without one, and `note` says why: `no_throughput_reason`).

    `created` is a timezone-naive local datetime built from `created_at` (unix seconds).
    """
    rows = []
    for r in runs:
        cfg, summary = r.get("config") or {}, r.get("summary") or {}
        created = r.get("created_at")
        rows.append({
            "run_id": r["run_id"], "label": r.get("label") or "", "mode": cfg.get("mode"),
            "model": cfg.get("model"), "world_size": cfg.get("world_size"),
            "status": r.get("status"), "samples_per_s": summary.get("samples_per_s"),
            "note": no_throughput_reason(r),
            "created": pd.Timestamp.fromtimestamp(created) if created else pd.NaT,
            "pinned": bool(r.get("pinned"))})
    df = pd.DataFrame(rows, columns=RUN_COLUMNS)
    return df.sort_values("created", ascending=False, na_position="last").reset_index(drop=True)


def filter_runs(df: pd.DataFrame, *, statuses: Iterable[str] = (), modes: Iterable[str] = (),
                models: Iterable[str] = (), text: str = "") -> pd.DataFrame:
    """Rows of a `runs_frame` that match every filter given (an empty filter matches all).

    `text` is matched case-insensitively against the run id, label and model."""
    keep = pd.Series(True, index=df.index)
    for column, wanted in (("status", statuses), ("mode", modes), ("model", models)):
        wanted = list(wanted)
        if wanted:
            keep &= df[column].isin(wanted)
    needle = text.strip().lower()
    if needle:
        hay = (df["run_id"].astype(str) + " " + df["label"].astype(str) + " "
               + df["model"].astype(str)).str.lower()
        keep &= hay.str.contains(needle, regex=False)
    return df[keep].reset_index(drop=True)


def eval_frame(events: Iterable[Event], run: str) -> pd.DataFrame:
    """One row per `eval` event of one run: run, step, val_accuracy (0-1), val_loss."""
    cols = ["run", "step", "val_accuracy", "val_loss"]
    rows = [{"run": run, "step": e.get("step"), "val_accuracy": e.get("val_accuracy"),
             "val_loss": e.get("val_loss")} for e in of_type(events, "eval")]
    return pd.DataFrame(rows, columns=cols)
