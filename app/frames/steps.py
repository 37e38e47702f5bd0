"""Step events -> frames: throughput, the step-time split, validation, bytes per device.

One row per optimizer step (DDP: the mean over ranks); times in ms, bytes in MiB.
"""

from __future__ import annotations

from typing import Iterable

import pandas as pd

from ddpviz.app.frames.base import Event, latest_volumes, mib, of_type
from ddpviz.engine.summary import (COMM_NOT_MEASURED, DP_COPIES, DP_COPIES_PART,  # noqa: F401 (DP_COPIES: views)
                                   EXPOSED_COMM_PART, WARMUP_STEPS, comm_part, run_steps, steady_positions)

STEP_COLUMNS = ["run", "step", "samples", "samples_per_s", "samples_per_s_smooth", "step_time_ms",
                "forward_ms", "backward_ms", "comm_exposed_ms", "optimizer_ms", "loss", "instrument"]


SMOOTH_STEPS = 9  # rolling-median window of `samples_per_s_smooth`, steps


_STEP_PARTS = {"forward_ms": "forward_s", "backward_ms": "backward_s",
               "comm_exposed_ms": "comm_exposed_s", "optimizer_ms": "optimizer_s"}


SPLIT_PARTS = ["forward", "backward", EXPOSED_COMM_PART, DP_COPIES_PART, "optimizer", "other"]


def steps_frame(events: Iterable[Event], run: str) -> pd.DataFrame:
    """One row per optimizer step of one run (times in ms): `engine.summary.run_steps`, the one
    rule for a run's step (DDP: the mean over ranks; samples_per_s = samples / that time), so
    every page reads the numbers the run's summary reads."""
    rows = run_steps(of_type(events, "step"))
    if not rows:
        return pd.DataFrame(columns=STEP_COLUMNS)
    g = pd.DataFrame(rows)
    out = pd.DataFrame({"run": run, "step": g["step"].astype(int), "samples": g["samples"]})
    out["samples_per_s"] = pd.to_numeric(g["samples_per_s"], errors="coerce")
    out["samples_per_s_smooth"] = out["samples_per_s"].rolling(SMOOTH_STEPS, min_periods=1).median()
    out["step_time_ms"] = g["step_time_s"] * 1000.0
    for col, src in _STEP_PARTS.items():  # None (not measured: FSDP's exposed comm on CUDA) -> NaN
        out[col] = pd.to_numeric(g[src], errors="coerce") * 1000.0
    out["loss"] = pd.to_numeric(g["loss"], errors="coerce")
    out["instrument"] = g["instrument"].astype(bool)
    return out[STEP_COLUMNS]


def steady_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """The rows of each run that its medians use: `engine.summary.steady_positions`, the run
    summary's own rule (warm-up skipped; steps carrying the instrument's own work left out while
    half the steps remain)."""
    parts = []
    for _, df in steps.groupby("run", sort=False):
        df = df.sort_values("step")
        parts.append(df.iloc[steady_positions(df["instrument"].astype(bool).tolist())])
    return pd.concat(parts, ignore_index=True) if parts else steps


def split_frame(steps: pd.DataFrame, modes: dict[str, str] | None = None) -> pd.DataFrame:
    """Median step-time split per run over its steady steps (`steady_steps`): columns run, part,
    ms, order. `steps` is `steps_frame` output (one or several runs). `other` is the step time the
    four parts do not cover (data loading, synchronisation), clipped at 0. A part a run did not
    measure (FSDP's exposed comm on CUDA) has no row, never a number: `unmeasured_parts` names it.
    `modes` (run -> mode) names a DP run's communication part `DP_COPIES_PART` (`comm_part`); a
    `single` run has none (one device communicates with nobody: its `comm_exposed_s` is a constant 0,
    engine/modes/single.py), so neither its bar nor a legend drawn from it names one.
    """
    cols = ["run", "part", "ms", "order"]
    if steps.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for run, df in steady_steps(steps).groupby("run", sort=False):
        med = df.median(numeric_only=True)
        parts = [med["forward_ms"], med["backward_ms"], med["comm_exposed_ms"], med["optimizer_ms"]]
        parts.append(max(0.0, med["step_time_ms"] - sum(v for v in parts if v == v)))
        mode = (modes or {}).get(run)
        names = ["forward", "backward", None if mode == "single" else comm_part(mode), "optimizer", "other"]
        rows += [{"run": run, "part": p, "ms": float(v), "order": SPLIT_PARTS.index(p)}
                 for p, v in zip(names, parts) if v == v and p is not None]
    return pd.DataFrame(rows, columns=cols)


def throughput_tiles(steps: pd.DataFrame, min_steps: int,
                     final: dict[str, float | None] | None = None) -> dict[str, tuple[float, str | None]]:
    """run -> (median samples/s over its steady steps (`steady_steps`), its ratio to the first other run's,
    e.g. "1.08× DDP"). The ratio only once every run has `min_steps` steady steps (the verdict's
    `engine.verdict.MIN_STEADY_STEPS`): before, a pair in turns set DP's ten steps against DDP's one warm-up
    step and read "17.54× DDP" under a verdict that said it was too early to tell; until then the ratio's
    place says when it comes. `final`: run -> its summary's samples/s, used instead of the window's median for a
    run that has ended (the summary saw every step; the window its newest, a trimmed stream fewer: a 64-device
    DP run's tile read 1,483 over its kept steps against its summary's 1,251, a new user 2026-12-06)."""
    steady = {run: df["samples_per_s"] for run, df in steady_steps(steps).groupby("run", sort=False)}
    medians = {run: float(v.median()) for run, v in steady.items()}
    medians.update({run: float(v) for run, v in (final or {}).items() if run in medians and v is not None})
    enough = all(len(v.dropna()) >= min_steps for v in steady.values())
    out = {}
    for run, v in medians.items():
        other = next(((r, o) for r, o in medians.items() if r != run and o > 0), None)
        ratio = f"{v / other[1]:.2f}× {other[0]}" if other and enough else None
        out[run] = (v, ratio or (f"ratio after {min_steps} steady steps" if other else None))
    return out


def unmeasured_parts(steps: pd.DataFrame) -> dict[str, str]:
    """run -> why a part of its split is missing: `engine.summary.COMM_NOT_MEASURED` for a run
    whose steady steps have no exposed comm (FSDP on CUDA), `FORWARD_NOT_SEEN` for one with no forward
    time (an attached process without DDP); runs with every part measured absent."""
    if steps.empty:
        return {}
    out = {}
    for run, df in steady_steps(steps).groupby("run", sort=False):
        said = [f"exposed comm {COMM_NOT_MEASURED}"] if df["comm_exposed_ms"].isna().all() else []
        if df["forward_ms"].isna().all():  # an attached process without DDP: no module's forward to time
            said.append(FORWARD_NOT_SEEN)
        if said:
            out[run] = "; ".join(said)
    return out


# an attached script's process without a DDP, DP or FSDP module (engine.attach.steps): its steps' forward_s is null
FORWARD_NOT_SEEN = "forward not seen (no DDP, DP or FSDP module in the process to time it; it is inside other)"


SPLIT_WORDS = {EXPOSED_COMM_PART: "all-reduce time not hidden behind backward",
               DP_COPIES_PART: "device 0's scatter, gather, reduce and broadcast, copies through one device "
                               "(not a collective)",
               "other": "data loading and synchronisation"}


def split_note(parts: set[str]) -> str:
    """The words under the step split for the parts it draws (`parts`), so a single run's caption
    explains no communication it did not have."""
    said = "; ".join(f"{p}: {w}" for p, w in SPLIT_WORDS.items() if p in parts)
    return (f"{said}. " if said else "") + (f"Median over the window's steps after the first {WARMUP_STEPS}, "
                                             "leaving out those carrying the instrument's own work, as the median "
                                             "samples/s.")


def eval_frame(events: Iterable[Event], run: str) -> pd.DataFrame:
    """One row per `eval` event of one run: run, step, val_accuracy (0-1), val_loss."""
    cols = ["run", "step", "val_accuracy", "val_loss"]
    rows = [{"run": run, "step": e.get("step"), "val_accuracy": e.get("val_accuracy"),
             "val_loss": e.get("val_loss")} for e in of_type(events, "eval")]
    return pd.DataFrame(rows, columns=cols)


def coinciding_runs(evals: pd.DataFrame) -> list[str]:
    """The runs of `eval_frame` rows whose validation accuracy is the same at every evaluation step
    they share (at least one): their lines lie on one another, so a chart shows one. Empty when
    fewer than two runs coincide. DP and DDP train the same math on the same batches, so with the
    same seed their accuracies often agree exactly."""
    if evals.empty or evals["run"].nunique() < 2:
        return []
    by_run = {run: dict(zip(g["step"], g["val_accuracy"])) for run, g in evals.groupby("run", sort=False)}
    runs = list(by_run)
    first = by_run[runs[0]]
    same = [r for r in runs[1:] if (shared := set(first) & set(by_run[r]))
            and all(first[s] == by_run[r][s] for s in shared)]
    return [runs[0], *same] if same else []


# What a volume of bytes is, named from the `volume_source` its `comm_volume` event carries (the
# text before the first colon; engine.modes.dp / ddp / fsdp write it), never from the run's mode.
MEASURED = "measured"  # DP: the bytes of the tensors copied
DERIVED = "derived (ring all-reduce)"  # DDP: bytes handed to all-reduce x 2(n-1)/n
DERIVED_FSDP = "derived (collective bytes x wire factor)"  # FSDP (engine.modes.fsdp.collectives)
UNLABELLED = "unlabelled (older run)"  # comm_volume events written before `volume_source`
THEORY = "theory"  # a formula (engine.analysis.theory_bytes, FSDP's theory_sent_bytes)
VOLUME_KINDS = [MEASURED, DERIVED, DERIVED_FSDP, UNLABELLED, THEORY]


def volume_label(volume_source: str | None) -> str:
    """The label of a volume of bytes from its event's `volume_source` alone: the text before the
    first colon ("measured: bytes of the tensors torch.nn.parallel copied" -> `MEASURED`), and
    `UNLABELLED` when the source is missing: a number whose source is unknown is not called
    measured."""
    return volume_source.split(":")[0] if volume_source else UNLABELLED


def comm_volume_frame(events: Iterable[Event]) -> pd.DataFrame:
    """Bytes each device sent/received in its latest reported step (`latest_volumes`; that step in `step`),
    beside the theory, in MiB.

    `source` is `volume_label` of the event's `volume_source`: "measured" (DP: the bytes of the
    tensors copied), "derived (ring all-reduce)" (DDP: bytes handed to all-reduce × 2(n−1)/n),
    "derived (collective bytes x wire factor)" (FSDP), or `UNLABELLED` when the event has none."""
    cols = ["device", "sent_mib", "recv_mib", "theory_sent_mib", "theory_recv_mib", "source", "step"]
    evs = latest_volumes(events)
    if not evs:
        return pd.DataFrame(columns=cols)
    rows = [{"device": e.get("device", "?"),
             **{c: mib(e.get(c.replace("_mib", "_bytes"))) for c in cols[1:-2]},
             "source": volume_label(e.get("volume_source")), "step": e.get("step")}
            for e in evs]
    return pd.DataFrame(rows, columns=cols).sort_values("device").reset_index(drop=True)


# ---- the step a "one step" view opens on (Bucket timeline, Live's detail, DP timeline) ---------
def typical_step(steps: list[int], step_events: Iterable[Event]) -> int | None:
    """The step a one-step view opens on: of `steps` (those whose detail events are complete), the
    one whose step time is nearest the median of the run's steady steps (`steady_positions`, the
    summary's rule), preferring steps without the instrument's own work (memory tracing, a replica
    check), then later steps on ties. Never the final step for being the latest: it is a traced one
    (`engine.measure.memory_sampler.should_trace_memory`), slower than the rest (step 299's exposed
    comm was 29 ms against a median of 3 ms, issue 33). Without step events: the latest of `steps`.
    """
    if not steps:
        return None
    rows, median = _timed_rows_and_median(step_events)
    by_step = {r["step"]: r for r in rows}
    candidates = [by_step[s] for s in steps if s in by_step]
    if median is None or not candidates:
        return steps[-1]
    best = min(candidates, key=lambda r: (bool(r["instrument"]), abs(r["step_time_s"] - median), -r["step"]))
    return int(best["step"])


def _timed_rows_and_median(step_events: Iterable[Event]) -> tuple[list[dict], float | None]:
    """The run's step rows with a time, and the median time of its steady steps without the
    instrument's work (all steady ones if none is without): the `typical_step` rule's median."""
    rows = [r for r in run_steps(of_type(step_events, "step")) if r.get("step_time_s") is not None]
    steady = [rows[i] for i in steady_positions([bool(r["instrument"]) for r in rows])]
    pool = [r for r in steady if not r["instrument"]] or steady
    return rows, (float(pd.Series([r["step_time_s"] for r in pool]).median()) if pool else None)


FAR_FROM_MEDIAN = 0.25  # a chosen step this far (relative) from the median step time is said to be


def typical_gap(step: int, step_events: Iterable[Event]) -> tuple[float, float] | None:
    """(the step's time, the run's median step time), seconds, when the step is more than
    `FAR_FROM_MEDIAN` from the median: the kept steps (`app.window`: the first, a spread, the
    newest) may all be slow, e.g. a short run on a machine that got busy. None when it is near, or
    unknown."""
    rows, median = _timed_rows_and_median(step_events)
    t = next((r["step_time_s"] for r in rows if r["step"] == step), None)
    if t is None or not median or abs(t - median) <= FAR_FROM_MEDIAN * median:
        return None
    return t, median


def step_notes(step_events: Iterable[Event], detail_events: Iterable[Event] = ()) -> dict[int, str]:
    """A word per step that was not an ordinary one: "instrumented" (its time includes the
    instrument's own work: memory tracing, a replica check) or "sampled" (its detail events say
    `sampled` or `instrumented`: full spans measured on that step only)."""
    notes = {int(r["step"]): "instrumented" for r in run_steps(of_type(step_events, "step")) if r["instrument"]}
    for e in detail_events:
        if (e.get("sampled") or e.get("instrumented")) and "step" in e:
            notes.setdefault(int(e["step"]), "sampled")
    return notes
