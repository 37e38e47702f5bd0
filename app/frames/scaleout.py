"""Pure transforms for the Scale-out page: a `workers.scaleout.report` -> DataFrames.

Every predicted row carries ``kind = "predicted"`` and every measured one ``kind = "measured"``,
so no chart can draw a prediction without saying so. Times in ms, sizes in bytes.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from ddpviz.app.frames import base as frames
from ddpviz.app.frames import buckets as fb
from ddpviz.engine.analysis import busiest_bytes

Report = dict[str, Any]
PRED_COLUMNS = ["mode", "series", "kind", "world_size", "nnodes", "samples_per_s", "efficiency",
                "step_time_ms", "comm_ms", "busiest_bytes"]
LANE = "predicted"  # the model's ranks are identical: one lane stands for every rank


def series(mode: str, kind: str) -> str:
    return f"{mode.upper()} ({kind})"


def prediction_frame(rep: Report) -> pd.DataFrame:
    """One row per predicted (mode, world size). `comm_ms`: DDP's exposed all-reduce, DP's four
    copy phases; `busiest_bytes`: sent + received per step by a DDP rank or DP's device 0 (`busiest_bytes`)."""
    rows = [{"mode": p["mode"], "series": series(p["mode"], "predicted"), "kind": "predicted",
             "world_size": p["world_size"], "nnodes": p.get("nnodes", 1),
             "samples_per_s": p["samples_per_s"], "efficiency": p["efficiency"],
             "step_time_ms": p["step_time_s"] * 1e3,
             "comm_ms": 1e3 * (p["comm_exposed_s"] if p["mode"] == "ddp" else p.get("comm_s", 0.0)),
             "busiest_bytes": busiest_bytes(p)}
            for p in rep.get("predictions") or []]
    return pd.DataFrame(rows, columns=PRED_COLUMNS)


def on_measured_single(pred: pd.DataFrame, single_samples_per_s: float | None) -> pd.DataFrame:
    """`prediction_frame` with its efficiency re-based on the single run's measured samples/s (the measured
    points' baseline, `measured_frame`), where there is one: samples/s(n) ÷ (n · that rate). Predictions come
    with efficiency against the model's own one-device rate; beside measured points on another baseline, the
    calibration run, equal to its prediction in the table, sat at 17% against a predicted 41% (the model's
    one device 43,691/s, the single run 102,559/s; a new user, 2026-12-06). Re-based, the predicted line starts
    where the model's one device stands against the real one, below 100% when the model is slower."""
    if not single_samples_per_s or pred.empty:
        return pred
    return pred.assign(efficiency=pred["samples_per_s"] / (pred["world_size"] * single_samples_per_s))


def measured_frame(rep: Report, single_samples_per_s: float | None) -> pd.DataFrame:
    """Real runs of the same config: samples/s and, when the set has a single-device baseline,
    efficiency = samples/s ÷ (n · the baseline's samples/s)."""
    rows = []
    for m in rep.get("measured") or []:
        eff = m["samples_per_s"] / (m["world_size"] * single_samples_per_s) if single_samples_per_s else None
        rows.append({"mode": m["mode"], "series": series(m["mode"], "measured"), "kind": "measured",
                     "world_size": m["world_size"], "nnodes": 1, "samples_per_s": m["samples_per_s"],
                     "efficiency": eff, "step_time_ms": (m.get("step_time_s") or 0) * 1e3,
                     "comm_ms": None, "busiest_bytes": None, "run_id": m["run_id"]})
    return pd.DataFrame(rows, columns=PRED_COLUMNS + ["run_id"])


IN_FIT = "in the fit"
OUT_OF_SAMPLE = "out of sample"


def validation_frame(rep: Report) -> pd.DataFrame:
    """Predicted vs measured per real run: step times (ms) and the step error in % (the report's own),
    `fit`: `OUT_OF_SAMPLE` or `IN_FIT` for a run that fed the fit, whose error tests nothing, and `why`: the
    reason it is in the fit (`engine.predict.validation.in_sample`), else empty. Samples/s are left out:
    with the global batch fixed they are the step time again (the CLI prints them)."""
    cols = ["run", "mode", "world size", "fit", "measured step (ms)", "predicted step (ms)", "step error %", "why"]
    rows = [[v["run_id"], v["mode"], v["world_size"], IN_FIT if v.get("in_fit") else OUT_OF_SAMPLE,
             v["measured_step_time_s"] * 1e3, v["predicted_step_time_s"] * 1e3, v["step_time_error_pct"],
             v.get("in_fit_reason") or "" if v.get("in_fit") else ""]
            for v in rep.get("validation") or []]
    return pd.DataFrame(rows, columns=cols)


def ddp_row(rep: Report, world_size: int) -> dict[str, Any] | None:
    return next((p for p in rep.get("predictions") or []
                 if p["mode"] == "ddp" and p["world_size"] == world_size), None)


def timeline_frames(row: dict[str, Any]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(buckets, backward, exposed) frames of a predicted DDP step, shaped like the Bucket
    timeline page's (`app.frames.buckets.bucket_frame`, `app.frames.buckets.backward_frame`, `app.frames.buckets.exposed_frame`)
    with one lane, `LANE`."""
    events = [dict(type="bucket", step=0, rank=0, num_params=None, **{k: b[k] for k in (
        "bucket_index", "nbytes", "ready_s", "comm_start_s", "comm_end_s")}) for b in row["buckets"]]
    steps = [dict(type="step", step=0, rank=0, backward_s=row["backward_s"],
                  comm_exposed_s=row["comm_exposed_s"])]
    buckets = fb.bucket_frame(events, 0)
    names = {0: LANE}
    return (fb.with_rank_names(buckets, names), fb.with_rank_names(fb.backward_frame(steps, 0), names),
            fb.with_rank_names(fb.exposed_frame(buckets, steps), names))


def bytes_frame(rep: Report) -> pd.DataFrame:
    """Bytes per step on the busiest device as n grows, predicted: DP's device 0 against a DDP
    rank. Columns: series, world_size, busiest_bytes, mib."""
    pred = prediction_frame(rep)
    out = pred[["series", "mode", "world_size", "busiest_bytes"]].copy()
    out["mib"] = out["busiest_bytes"] / frames.MIB
    return out.reset_index(drop=True)


def _ddp_ahead(rep: Report) -> pd.Series | None:
    """world size (> 1, both modes predicted) -> DDP's predicted samples/s above DP's; None without both."""
    pred = prediction_frame(rep)
    wide = pred.pivot_table(index="world_size", columns="mode", values="samples_per_s")
    if not {"dp", "ddp"} <= set(wide.columns):
        return None
    wide = wide.dropna()
    return (wide["ddp"] > wide["dp"])[wide.index > 1]


def crossover(rep: Report) -> int | None:
    """The smallest predicted world size > 1 from which DDP's samples/s beats DP's for good
    (None if DP never falls behind, or one mode is missing)."""
    ahead = _ddp_ahead(rep)
    for n in [] if ahead is None else ahead.index:
        if ahead.loc[n:].all():
            return int(n)
    return None


def crossover_text(rep: Report) -> str:
    """The DP-vs-DDP sentence under the predictions, said only of what was modelled: when one mode
    has no prediction (no measured run of it in the set to calibrate on), it says so and states
    nothing about that mode. Where DDP is ahead at some sizes but not for good (on a CPU host, ahead
    at the run's own n and behind beyond the cores), it names both, never "does not pull ahead"."""
    modes = set(prediction_frame(rep)["mode"])
    missing = [m.upper() for m in ("dp", "ddp") if m not in modes]
    if missing:
        return (f"{' and '.join(missing)} not modelled (no measured {' or '.join(missing)} run in this "
                f"run's set to calibrate on): nothing is predicted or said about {' or '.join(missing)} here.")
    cross = crossover(rep)
    if cross:
        return f"Predicted: DDP's samples/s pulls ahead of DP's from n = {cross} on."
    ahead = _ddp_ahead(rep)
    at, behind = ([str(n) for n, a in ahead.items() if bool(a) == want] for want in (True, False))
    if at:
        return (f"Predicted: DDP's samples/s is ahead of DP's at n = {', '.join(at)} and behind at "
                f"n = {', '.join(behind)}: no world size from which it stays ahead.")
    return "Predicted: DDP does not pull ahead of DP at these world sizes."


def this_machine_means(backend: str | None = None) -> str:
    """What "this machine" is: the link fitted to the chosen run's own all-reduces, in the words of
    its backend (`run_started.backend`): gloo over loopback on a CPU host, NCCL between GPUs."""
    link = {"gloo": "gloo over loopback on this host", "nccl": "NCCL between this host's GPUs"}.get(
        backend or "", f"{backend} on this host" if backend else "the run's backend on this host")
    return ("\"This machine\" is this host as measured: the link's α and β fitted to the run's own "
            f"all-reduces ({link}: its buckets and its probe) and the compute its runs measured.")


def _rank_compute_s(row: dict[str, Any]) -> float:
    """A device's own work in a predicted row: a DDP rank's forward + backward + optimizer (every rank steps);
    DP's forward and backward phases (its optimizer runs on device 0 alone, not time-shared)."""
    if row["mode"] == "ddp":
        return row["forward_s"] + row["backward_s"] + row["optimizer_s"]
    return row["phases"]["forward"] + row["phases"]["backward"]


_WORK = {"ddp": "a DDP rank's forward + backward + optimizer", "dp": "a DP device's forward + backward"}


def host_slowdown_text(rep: Report, *, as_measured: bool, fitted_link: bool) -> str | None:
    """Why efficiency collapses with compute as measured on a CPU host, or None where it does not apply.

    On CPU the predictor time-shares the host's cores among the ranks (`engine.predict.scaleout`: k(n) =
    n·t/cores scales the compute, optimizer and gloo's all-reduce) and keeps the share of compute that does not
    shrink with the batch, so a rank's own work grows with n: efficiency then falls towards 0, which
    "measured compute" alone does not explain. Said only when that growth is in the report: compute as measured,
    a CPU calibration run (DDP's, else DP's), and a device's predicted work (`_rank_compute_s`) at the largest world
    size above the one at the run's own. Names the figures: the cores, the run, both compute times, the share.
    `as_measured`, `fitted_link`: the scenario's compute is the measured one, its link the one fitted to the run
    (the page knows the presets; frames import no `engine.predict`)."""
    if not as_measured:
        return None
    mode = next((m for m in ("ddp", "dp") if m in rep.get("calibration", {})), None)
    cal = rep.get("calibration", {}).get(mode) or {}
    rows = {p["world_size"]: p for p in rep.get("predictions") or [] if p["mode"] == mode}
    n_m, cores = cal.get("world_size"), cal.get("host_cpu_count")
    if cal.get("device_kind") != "cpu" or not cores or n_m not in rows:
        return None
    top = max(rows)
    at_run, at_top = _rank_compute_s(rows[n_m]), _rank_compute_s(rows[top])
    if top <= n_m or at_top <= at_run * 1.05:
        return None
    comm = ", its gloo all-reduces slowing down with it" if mode == "ddp" and fitted_link else ""
    share = (rep.get("fixed_fraction") or {}).get("value")
    fixed = f"; {share:.0%} of the measured compute does not shrink with the smaller batch per rank" if share else ""
    return (f"Why efficiency falls: compute is this host's as measured, and on its {cores} CPU cores it grows with "
            f"world size. Ranks beyond the cores time-share them, so {_WORK[mode]}, {at_run * 1e3:.2f} ms at the "
            f"run's n = {n_m} ({mode.upper()} run {str(cal.get('run_id', ''))[:8]}), is predicted at "
            f"{at_top * 1e3:.2f} ms at n = {top}{comm}{fixed}. The prediction carries this host's slowdown; a GPU "
            "compute preset predicts other hardware.")
