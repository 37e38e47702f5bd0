"""Run records -> the Runs table: one row per run, filters, and why a run has no figure.
"""

from __future__ import annotations

from typing import Any, Iterable

import pandas as pd

from ddpviz.app.frames import base as frames_base
from ddpviz.engine.stages import where_failed

RUN_COLUMNS = ["run_id", "label", "mode", "model", "world_size", "status", "samples_per_s", "val_accuracy",
               "wall_s", "source", "note", "created", "pinned"]  # the figures first, where the table opens


def cancel_reason(error: dict[str, Any] | None) -> str:
    """A canceled run's reason: its error's exception without the "Canceled: " the worker puts first
    (`workers.jobs.run`), which the page's own words ("Run canceled", "canceled after") already say."""
    return str((error or {}).get("exception") or "").removeprefix("Canceled: ")


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
    if status == "canceled":  # and why: a worker's shutdown read as a user's cancel (a new user, 2026-12-06)
        why = cancel_reason(run.get("error")).split("\n", 1)[0]
        return f"canceled after {steps}" + (f": {why}" if why else "")
    if status == "lost":
        # no summary: the worker that builds it died; Live still draws the steps the stream holds (a new user saw
        # 20,696 samples/s there against a dash here, 2026-12-06)
        return "lost: its worker stopped sending heartbeats before its summary; Live shows its stored steps"
    if status == "failed":
        where = where_failed(run.get("error"), (run.get("config") or {}).get("mode"))
        return f"failed{f' ({where})' if where else ''} after {steps}"
    return f"{status or 'unknown'}: no steps measured"


def run_source(run: dict[str, Any]) -> str:
    """Where a run came from: "launched" (by ddpviz), or "attached · SCRIPT · HOST" for a script run
    under `ddpviz run` (its `run_started`, kept in the record, names both; docs/events.md)."""
    cfg, started = run.get("config") or {}, run.get("started") or {}
    if not (cfg.get("attached") or started.get("attached")):
        return "launched"
    script = started.get("script") or " ".join(cfg.get("command") or []) or "?"
    return " · ".join(p for p in ("attached", script, started.get("hostname") or "") if p)


def wall_seconds(run: dict[str, Any]) -> float | None:
    """A finished run's wall time in seconds: `finished_at` − `started_at` of its record (the
    worker's, or `ddpviz run`'s, clock: start-up, training, evaluation and teardown). None while it
    runs or when either time is missing (never a guess)."""
    start, end = run.get("started_at"), run.get("finished_at")
    if not start or not end or end < start:
        return None
    return float(end) - float(start)


def runs_frame(runs: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """The Runs table: one row per run (newest first), `samples_per_s` from its summary (NaN
    without one, and `note` says why: `no_throughput_reason`).

    `created` is a timezone-naive local datetime built from `created_at` (unix seconds): when the
    run was made (an uploaded attached run: when it ran, `workers.attached.create_record`).
    `val_accuracy`: the summary's final validation accuracy (NaN without an evaluation, e.g. an
    attached script's). `wall_s`: `wall_seconds`.
    """
    rows = []
    for r in runs:
        cfg, summary = r.get("config") or {}, r.get("summary") or {}
        created = r.get("created_at")
        rows.append({
            "run_id": r["run_id"], "label": r.get("label") or "", "mode": cfg.get("mode"),
            "model": cfg.get("model"), "source": run_source(r),
            "world_size": frames_base.devices_used(cfg),
            "status": r.get("status"), "samples_per_s": summary.get("samples_per_s"),
            "val_accuracy": summary.get("val_accuracy"), "wall_s": wall_seconds(r),
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


def remap_selection(shown_before: list[str], rows: Iterable[int], shown_now: list[str]) -> list[int]:
    """The rows of `shown_now` (run ids, top to bottom) holding the runs selected at `rows` of `shown_before`,
    in the new order; runs no longer shown drop out. Streamlit keys a table's selection by row position
    (`st.dataframe`'s `selection.rows`), so without this a new run at the top moved every tick one run down:
    "Re-run 1" of one run left the next one selected, and Delete would have taken it (a new user, 2026-12-06)."""
    at = {rid: i for i, rid in enumerate(shown_now)}
    picked = [shown_before[i] for i in rows if 0 <= i < len(shown_before)]
    return sorted(at[rid] for rid in picked if rid in at)

