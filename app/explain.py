"""Sentences the pages show beside the numbers: what CPU DP emulates, and why DP leads when it does.

Pure functions of `app.frames.compare.compare_frame` rows (no Streamlit), so they are tested directly.
"""

from __future__ import annotations

import pandas as pd

from app.frames import steps as fsteps

EMULATION_NOTE = (
    "DP on CPU is emulated: one process, a thread per virtual device, replicas rebuilt from "
    "device 0 every step and every tensor really copied — at RAM speed here, where a GPU box "
    "copies over PCIe or NVLink to and from device 0 while the other GPUs wait.")

# the split's parts as `compare_frame` columns, with what each means for DP and for DDP
_PARTS = [("forward_ms", "forward", "forward"),
          ("backward_ms", "backward", "backward"),
          ("comm_exposed_ms", "copies to and from device 0", "all-reduce left exposed after backward"),
          ("optimizer_ms", "the optimizer", "the optimizer"),
          ("other_ms", "time outside the timed phases", "time outside the timed phases")]


def _with_other(row: pd.Series) -> dict[str, float]:
    parts = {c: float(row.get(c) or 0.0) for c, _, _ in _PARTS[:-1]}
    parts["other_ms"] = max(0.0, float(row.get("step_time_ms") or 0.0) - sum(parts.values()))
    return parts


LEVEL_WITHIN = 1.02  # DP ahead by less than this: said to be level, not ahead


def why_dp_ahead(table: pd.DataFrame) -> str | None:
    """When the set's DP run has more samples/s than its DDP run, why, from their measured split.

    Names the parts of the step where DDP spends the most extra time, and DP's own copy time;
    None when there is no DP/DDP pair, a figure is missing, or DDP is ahead."""
    dp, ddp = table[table["mode"] == "dp"], table[table["mode"] == "ddp"]
    if dp.empty or ddp.empty:
        return None
    a, b = dp.iloc[0], ddp.iloc[0]
    if not (a["samples_per_s"] > 0 and b["samples_per_s"] > 0) or a["samples_per_s"] <= b["samples_per_s"]:
        return None
    pa, pb = _with_other(a), _with_other(b)
    extra = sorted(((pb[c] - pa[c], ddp_name) for c, _, ddp_name in _PARTS), reverse=True)
    named = [f"+{d:.2f} ms in {name}" for d, name in extra[:2] if d > 0.005]
    longer = float(b["step_time_ms"]) - float(a["step_time_ms"])
    ratio = a["samples_per_s"] / b["samples_per_s"]
    if ratio < LEVEL_WITHIN:
        lead = (f"DP and DDP are level here (DP at {ratio:.3f}× DDP's samples/s, within "
                f"{LEVEL_WITHIN - 1:.0%}). ")
    else:
        lead = (f"DP is ahead here ({ratio:.2f}× DDP's samples/s). "
                f"From the runs' own measured split, DDP's step is {longer:.2f} ms longer")
        lead += (": " + " and ".join(named) + ". ") if named else ". "
    return (lead + f"DP's copies cost it {pa['comm_exposed_ms']:.2f} ms per step, made at RAM "
            "speed between threads of one process; on GPUs the same copies cross PCIe or NVLink "
            "through device 0, which DDP's ring all-reduce avoids.")


def table_from_steps(steps: pd.DataFrame, modes: dict[str, str]) -> pd.DataFrame:
    """The columns `why_dp_ahead` reads, computed as the Live page computes its own figures:
    medians over the steps its metric uses (`app.frames.steps.steady_steps`, the run summary's rule).
    `modes`: run -> mode."""
    cols = ["step_time_ms", "forward_ms", "backward_ms", "comm_exposed_ms", "optimizer_ms"]
    rows = []
    for run, df in fsteps.steady_steps(steps).groupby("run", sort=False):
        rows.append({"run": run, "mode": modes.get(run, "?"),
                     "samples_per_s": float(df["samples_per_s"].median()),
                     **df[cols].median().to_dict()})
    return pd.DataFrame(rows, columns=["run", "mode", "samples_per_s", *cols])
