"""Pure transforms for the Tune page: a stored `ddpviz tune` report (`workers.tunes`) -> the trials
table, the rows of the ratio chart, and which stored runs show a trial's buckets.

A ratio is a candidate's step time over the same round's baseline (< 1 is faster), as `ddpviz
tune` measured and predicted it (docs/tune.md); nothing here measures or recomputes one.
"""

from __future__ import annotations

import datetime as dt
import shlex
from typing import Any

import pandas as pd

from ddpviz.workers.tunes import label, note_check  # one name per setting, one check word: terminal and app

MEASURED = "measured (median of rounds, 90% bootstrap interval)"
PREDICTED = "predicted (scale-out step model)"
TABLE_COLUMNS = ["setting", "predicted ratio", "measured ratio", "90% interval", "verdict", "loss diff", "check",
                 "rejected"]

Report = dict[str, Any]


def interval_text(interval: list[float] | None) -> str:
    """"0.628–1.095", or "-" without an interval (one round, or not measured)."""
    return f"{interval[0]:.3f}–{interval[1]:.3f}" if interval else "-"


def trials_frame(rep: Report) -> pd.DataFrame:
    """One row per candidate, in the report's order (by predicted ratio): `TABLE_COLUMNS`."""
    rows = [{"setting": label(t["knobs"]), "predicted ratio": t.get("predicted_ratio"),
             "measured ratio": t.get("ratio"), "90% interval": interval_text(t.get("interval")),
             "verdict": t.get("verdict"), "loss diff": t.get("loss_max_abs_diff"),
             "check": note_check(t.get("note")),
             "rejected": bool(t.get("rejected"))}
            for t in rep.get("trials") or []]
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


def trial_notes(rep: Report) -> list[str]:
    """Each trial's whole note ("setting: same math: losses within 1.01e-05 of the baseline's (largest ...)"),
    for the lines under the table, whose `check` column holds its first words only: in the table the note was
    cut at the page's width (a new user, 2026-12-06)."""
    return [f"{label(t['knobs'])}: {t['note']}" for t in rep.get("trials") or [] if t.get("note")]


def ratio_frame(rep: Report) -> pd.DataFrame:
    """The ratio chart's rows: per candidate, its measured ratio with the interval's ends (`lo`,
    `hi`; NaN without one) and its predicted ratio, each where the report has it; `series` is
    `MEASURED` or `PREDICTED`."""
    rows = []
    for t in rep.get("trials") or []:
        name, iv = label(t["knobs"]), t.get("interval")
        if t.get("ratio") is not None:
            rows.append(dict(setting=name, series=MEASURED, ratio=t["ratio"], lo=iv[0] if iv else None,
                             hi=iv[1] if iv else None, verdict=t.get("verdict")))
        if t.get("predicted_ratio") is not None:
            rows.append(dict(setting=name, series=PREDICTED, ratio=t["predicted_ratio"], lo=None, hi=None,
                             verdict=t.get("prediction_basis")))
    return pd.DataFrame(rows, columns=["setting", "series", "ratio", "lo", "hi", "verdict"])


def _by_round(runs: list[dict[str, Any]]) -> dict[int, str]:
    return {r["round"]: r["run_id"] for r in runs if r.get("run_id") and r.get("round") is not None}


def stored_pairs(rep: Report, index: int) -> dict[int, tuple[str, str]]:
    """Round -> (the baseline's run id, candidate `index`'s run id) for the rounds where both
    trials were stored: the two runs whose ratio the report took."""
    base = _by_round(rep["baseline"].get("runs") or [])
    cand = _by_round(rep["trials"][index].get("runs") or [])
    return {r: (base[r], cand[r]) for r in sorted(cand) if r in base}


def tune_name(rep: Report) -> str:
    """What the chooser shows: ``"12-04 21:30:05 · train.py · best: bucket_cap_mb=4.0 (3f9c0a1b2d)"``."""
    when = dt.datetime.fromtimestamp(rep["stored_at"]).strftime("%m-%d %H:%M:%S") if rep.get("stored_at") else "?"
    scripts = [a for a in rep.get("command") or [] if a.endswith(".py")]
    best = rep.get("best")
    return (f"{when} · {scripts[-1] if scripts else shlex.join(rep.get('command') or [])} · "
            f"{'best: ' + label(best['knobs']) if best else 'none beat the baseline'} ({rep.get('tune_id')})")


def baseline_text(rep: Report) -> str:
    """The baseline in one line: ranks, step time, bucket bytes, the script's settings."""
    b = rep["baseline"]
    step = f"{b['step_time_s'] * 1e3:.2f} ms" if b.get("step_time_s") else "not measured"
    sizes = ", ".join(f"{n:,}" for n in b.get("bucket_bytes") or [])
    settings = ", ".join(f"{k}={v}" for k, v in (b.get("settings") or {}).items())
    return (f"Baseline: {b.get('world_size')} rank(s), step {step} (median of steady steps {rep.get('warmup')}.."
            f"{(rep.get('steps') or 0) - 1} over its trials), {len(b.get('bucket_bytes') or [])} bucket(s) of "
            f"[{sizes}] bytes; the script's own settings: {settings}.")


def prediction_text(rep: Report) -> str | None:
    """The predictor's error on this script (predicted / measured − 1), or None when no trial has both."""
    err = rep.get("prediction_error") or {}
    if not err.get("count"):
        return None
    return (f"Predictor error (predicted ÷ measured − 1) over {err['count']} trial(s): median |error| "
            f"{err['median_abs']:.1%}, worst {err['worst']:+.1%}.")
