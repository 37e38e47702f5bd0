"""Pure transforms for the Sweeps page: one row per run of a sweep, scaling efficiency.

Numbers come from each finished run's summary (the engine's medians after warm-up); runs still
queued or running appear in the status table only.

Scaling efficiency of a run on n devices: ``samples_per_s(n) / (n · samples_per_s(single))`` —
1.0 is linear scaling; the single run is 1.0 at n = 1 by definition.

Shape sweeps (`shape_frame`): per model shape, DDP's samples/s ÷ DP's and each run's GIL share
(the mean over its devices of the summary's `gil_wait_share`, measured by the engine).
"""

from __future__ import annotations

from typing import Any, Iterable

import pandas as pd

from ddpviz.app.frames import base as frames
from ddpviz.workers.sweeps import parse_shape  # one parser for the form and the sweep

SWEEP_COLUMNS = ["run_id", "label", "mode", "world_size", "bucket_cap_mb", "overlap", "status",
                 "samples_per_s", "step_time_ms", "comm_exposed_ms", "overlap_frac", "width", "depth",
                 "gil_wait_share"]


def sweep_frame(runs: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """One row per run (records as `DdpvizClient.get_run` returns them)."""
    rows = []
    for r in runs:
        cfg, s = r.get("config") or {}, r.get("summary") or {}
        mode = cfg.get("mode")
        rows.append({
            "run_id": r["run_id"], "label": r.get("label") or r["run_id"][:8], "mode": mode,
            "world_size": frames.devices_used(cfg),
            "bucket_cap_mb": cfg.get("bucket_cap_mb"), "overlap": cfg.get("overlap"),
            "status": r.get("status"), "samples_per_s": s.get("samples_per_s"),
            "step_time_ms": _ms(s.get("step_time_s")),
            # one device without collectives communicates with nobody: the constant 0 of single (engine/modes/single.py)
            # and of DP on one device, which runs the module itself (engine/modes/dp/emulated.py, `_alone`), is no
            # measurement; DDP on one rank still all-reduces (over a group of one), timed
            "comm_exposed_ms": None if mode == "single" or (mode == "dp" and frames.devices_used(cfg) == 1)
            else _ms(s.get("comm_exposed_s")),
            "overlap_frac": s.get("overlap") if mode in ("ddp", "fsdp") else None,  # DP: no all-reduce
            "width": cfg.get("width"), "depth": cfg.get("depth"),
            "gil_wait_share": mean_share(s.get("gil_wait_share"))})
    return pd.DataFrame(rows, columns=SWEEP_COLUMNS)


def mean_share(by_device: dict[str, float | None] | None) -> float | None:
    """Mean of a summary's per-device `gil_wait_share` (devices not measured left out)."""
    vals = [v for v in (by_device or {}).values() if v is not None]
    return sum(vals) / len(vals) if vals else None


def shape_frame(sweep: pd.DataFrame) -> pd.DataFrame:
    """Per model shape with a finished DP and DDP run: columns shape ("W×D"), width, depth,
    dp_samples_per_s, ddp_samples_per_s, ddp_over_dp (DDP ÷ DP samples/s), dp_gil_share,
    ddp_gil_share; ordered by DP's GIL share."""
    cols = ["shape", "width", "depth", "dp_samples_per_s", "ddp_samples_per_s", "ddp_over_dp",
            "dp_gil_share", "ddp_gil_share"]
    done = sweep.dropna(subset=["samples_per_s", "width", "depth"])
    rows = []
    for (w, d), df in done.groupby(["width", "depth"]):
        by = {m: df[df["mode"] == m].iloc[-1] for m in ("dp", "ddp") if (df["mode"] == m).any()}
        if len(by) < 2:
            continue
        dp, ddp = by["dp"], by["ddp"]
        rows.append({"shape": f"{int(w)}×{int(d)}", "width": int(w), "depth": int(d),
                     "dp_samples_per_s": dp["samples_per_s"], "ddp_samples_per_s": ddp["samples_per_s"],
                     "ddp_over_dp": ddp["samples_per_s"] / dp["samples_per_s"] if dp["samples_per_s"] else None,
                     "dp_gil_share": dp["gil_wait_share"], "ddp_gil_share": ddp["gil_wait_share"]})
    out = pd.DataFrame(rows, columns=cols)
    return out.sort_values("dp_gil_share", na_position="first").reset_index(drop=True)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def efficiency_frame(sweep: pd.DataFrame) -> pd.DataFrame:
    """Finished runs with `efficiency` and `speedup` vs the sweep's single run.

    Columns: label, mode, world_size, samples_per_s, speedup, efficiency (NaN without a
    finished single run)."""
    cols = ["label", "mode", "world_size", "samples_per_s", "speedup", "efficiency"]
    done = sweep.dropna(subset=["samples_per_s"])
    if done.empty:
        return pd.DataFrame(columns=cols)
    single = done.loc[done["mode"] == "single", "samples_per_s"]
    base = float(single.iloc[0]) if len(single) else float("nan")
    out = done.assign(speedup=done["samples_per_s"] / base)
    out["efficiency"] = out["speedup"] / out["world_size"].astype(float)
    return out[cols].sort_values(["mode", "world_size"]).reset_index(drop=True)


def bucket_sweep_frame(sweep: pd.DataFrame) -> pd.DataFrame:
    """Finished runs' step time and exposed comm per bucket cap, long form:
    columns label, bucket_cap_mb, which (step time | exposed comm), ms."""
    cols = ["label", "bucket_cap_mb", "which", "ms"]
    done = sweep.dropna(subset=["step_time_ms"])
    if done.empty:
        return pd.DataFrame(columns=cols)
    long = done.melt(id_vars=["label", "bucket_cap_mb"], value_vars=["step_time_ms",
                                                                     "comm_exposed_ms"],
                     var_name="which", value_name="ms")
    long["which"] = long["which"].map({"step_time_ms": "step time",
                                       "comm_exposed_ms": "exposed comm"})
    return long[cols].sort_values(["which", "bucket_cap_mb"]).reset_index(drop=True)


def parse_values(text: str, kind: str) -> list[Any]:
    """The sweep's values from a comma-separated string.

    Raises:
        ValueError: a value is not a number (world sizes: a whole number ≥ 1; caps: > 0).
    """
    out: list[Any] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if kind == "shape":
            out.append(parse_shape(part))
        elif kind == "world_size":
            if not part.isdigit() or int(part) < 1:
                raise ValueError(f"world sizes are whole numbers >= 1 (got {part!r})")
            out.append(int(part))
        else:
            try:
                v = float(part)
            except ValueError:
                raise ValueError(f"bucket caps are numbers of MiB (got {part!r})") from None
            if v <= 0:
                raise ValueError(f"bucket caps must be > 0 MiB (got {part!r})")
            out.append(v)
    if not out:
        raise ValueError("give at least one value")
    return out
