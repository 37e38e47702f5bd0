"""A run's summary, built from the events it emitted (the same numbers the UI shows), and the one
rule every page, the summary and the predictor use for "a run's step" and "its steady steps".

A run's step (`run_steps`): per optimizer step, the mean over ranks of each rank's step time and
parts, samples/s = samples / that mean. Each rank's time includes its wait for the others and runs
from its own previous step's end, so every rank's times add up to the run's wall time; the mean
keeps that, while the slowest rank per step adds half the step-to-step change of the ranks' skew
(it biased DDP down by up to 15% against the run's wall time here).

overlap = 1 − exposed comm / total comm (README, "How the numbers are made"), where total comm per step is the length of the
union of the bucket all-reduce intervals on rank 0, and exposed comm is the step's `comm_exposed_s`.
Overlap is measured over the steady steps only when every one of them timed its all-reduces: where
some did not (bucket_timing=recorder off the profiled steps), `overlap` is null and `overlap_note` says
why, so the figure never stands for steps it did not see (early in a run the profiled steps 0-2 alone
gave 0%, then "not measured" once they were left out).
A step whose `comm_exposed_s` is null (FSDP on CUDA) has no exposed comm and no overlap:
the summary's `comm_exposed_s` is then null with `comm_exposed_note` = `COMM_NOT_MEASURED`.
Medians skip warm-up steps (the first `WARMUP_STEPS`, fewer for short runs) and the steps whose
time includes the instrument's own work — memory tracing (`memory_traced`) or DP's replica
checksums (`replica_check`) — while at least half the steps remain. Peak memory per device is the largest measured `peak_allocated_bytes` of its `memory`
events (the live-tensor ledger's maximum on CPU, the CUDA allocator's on GPU), never an estimate.
On CUDA the allocator's peak also holds what libraries keep (cuBLAS workspaces): `memory` events
that carry `peak_training_bytes` and `library_floor_bytes` (`engine.measure.memory.step_memory_parts`)
give `peak_training_bytes` / `library_floor_bytes` per device (the training's peak from steps >= 1
when there are any: step 0 allocates the workspaces inside the step), and `memory_imbalance` is then
max/min of the training's peaks.
`events_lost` sums the `events_lost` of the run's `log` events: events a rank's writer dropped
(`engine.batching.BatchingSink`), so a summary built without them says so.
GIL wait per device is the median of its `gil` events' `gil_wait_share` over the same steady steps
(engine.measure.gil: measured from the thread's CPU clock and run-queue wait).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any, Iterable, Sequence

from ddpviz.engine.events import NONFINITE_SUFFIX, nonfinite_name

WARMUP_STEPS = 3  # first steps a median skips (fewer for short runs): caches, bucket rebuild
INSTRUMENT_FLAGS = ("memory_traced", "replica_check")  # a step that carries the instrument's own work
STEP_PARTS = ("step_time_s", "forward_s", "backward_s", "comm_exposed_s", "optimizer_s")
VOLUME_KEYS = ("sent_bytes", "recv_bytes", "volume_source", "allreduce_bytes", "theory_sent_bytes",
               "theory_recv_bytes")
SPLIT_KEYS = ("step_time_s", "forward_s", "backward_s", "comm_exposed_s", "optimizer_s", "samples_per_s")
# DP's scatter/gather/reduce/broadcast are copies through device 0, not a collective left exposed: the same
# field of its step events (`comm_exposed_s`) is named for what it is wherever it is shown (`comm_part`).
DP_COPIES = "DP copies (scatter/gather/reduce/broadcast)"  # the Compare table's row
DP_COPIES_PART = "DP copies"  # the step split's part: its legend sits in a third of the Live page
EXPOSED_COMM_PART = "exposed comm"


def comm_part(mode: str | None) -> str:
    """What a run's `comm_exposed_s` is called: DP's copies, or the other modes' exposed comm."""
    return DP_COPIES_PART if mode == "dp" else EXPOSED_COMM_PART


# A single device's comm: it talks to nobody, so no time was measured; its steps' 0.0 is a constant
# (engine/modes/single.py), and compare's report gives null with these words (a new user, 2026-12-06).
NO_COMM_ONE_DEVICE = "no communication (one device)"
# What every reader shows where a step's `comm_exposed_s` is null: FSDP on CUDA, whose collectives
# run on FSDP2's comm streams, which the host clock cannot tell hidden from exposed
# (engine/modes/fsdp/step.py). Never a number in its place.
COMM_NOT_MEASURED = "not measured on CUDA"
# FSDP2 issues gloo collectives with async_op=False on the training thread (engine/modes/fsdp/step.py): on CPU its
# measured overlap is 0 by construction, not for want of prefetching; said beside the figure (Compare, the CLI)
FSDP_HOST_BLOCKING = "FSDP2 runs each gloo collective on the training thread, so none overlaps compute"
# the summary's `overlap_note` when steady steps had buckets with no all-reduce end (bucket_timing=recorder)
# the verdict's words for it (the verdict is read first, on every page: the tour found it a wall of text)
OVERLAP_NOT_MEASURED_SHORT = ("not measured: its exposed part is, every step, but the total all-reduce time only "
                              "on the profiled steps (bucket_timing=recorder; hook times every step)")
OVERLAP_NOT_MEASURED = ("not measured: overlap is 1 − exposed / total all-reduce time; the exposed part is measured "
                        "every step (DDP's reducer: from the last gradient's ready time to backward's end), but the total needs each "
                        "all-reduce's start and end, which bucket_timing=recorder (no cost per bucket) times on the "
                        "profiled steps only; bucket_timing=hook times them every step, at a cost per bucket")


def interval_union_s(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by the intervals (seconds)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def run_steps(step_events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per optimizer step of a run, in step order, from its `step` events (any ranks).

    Each row: step, samples (max over ranks; None where no rank saw them), the mean over ranks of `STEP_PARTS` (seconds; None
    where a rank reported None: not measured, see `COMM_NOT_MEASURED`),
    samples_per_s (samples / mean step time; None when that is 0 or samples is None), loss (mean over ranks: each
    rank's loss is the mean over its own shard; None with `loss_nonfinite` "nan"/"inf"/"-inf"
    when any rank's was non-finite, `engine.events.mark_nonfinite`), instrument (any rank's step carried memory tracing
    or a replica check), ranks (how many ranks reported it).
    """
    by_step: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in step_events:
        by_step[e["step"]].append(e)
    rows = []
    for step in sorted(by_step):
        evs = by_step[step]
        seen = [e["samples"] for e in evs if e.get("samples") is not None]  # null: not seen (an attached script
        row: dict[str, Any] = {"step": step, "samples": max(seen) if seen else None}  # without DDP, DP or FSDP)
        for k in STEP_PARTS:  # a part some rank could not measure (None) is None for the step
            vals = [e.get(k, 0.0) for e in evs]
            row[k] = None if any(v is None for v in vals) else sum(vals) / len(vals)
        row["loss"], bad = mean_loss(evs, "loss")
        if bad:
            row["loss_nonfinite"] = bad
        row["samples_per_s"] = (row["samples"] / row["step_time_s"] if row["samples"] is not None
                                and row["step_time_s"] > 0 else None)
        row["instrument"] = any(bool(e.get(f)) for e in evs for f in INSTRUMENT_FLAGS)
        row["ranks"] = len(evs)
        rows.append(row)
    return rows


def mean_loss(events: Sequence[dict[str, Any]], key: str) -> tuple[float | None, str | None]:
    """(mean of `key` over `events`, None) — or (None, "nan"/"inf"/"-inf") when any event's value
    is non-finite (a float NaN/inf, or null with `<key>_nonfinite`): the mean of a NaN is NaN, never
    the mean of the other ranks. (None, None) when no event has a value."""
    vals, bad = [], None
    for e in events:
        v, named = e.get(key), e.get(key + NONFINITE_SUFFIX)
        if named or (isinstance(v, float) and v - v != 0):
            bad = named or nonfinite_name(v)
        elif v is not None:
            vals.append(v)
    if bad:
        return None, bad
    return (sum(vals) / len(vals) if vals else None), None


def steady_positions(instrumented: Sequence[bool]) -> list[int]:
    """Positions (into a run's steps in step order) of the steps its medians use.

    The first `WARMUP_STEPS` steps are skipped (a quarter of them for runs shorter than 12 steps);
    of the rest, the steps flagged `instrumented` (their time includes the instrument's own work)
    are left out while at least half remain. Empty input gives [].
    """
    n = len(instrumented)
    late = list(range(min(WARMUP_STEPS, n // 4), n)) or list(range(n))
    plain = [i for i in late if not instrumented[i]]
    return plain if 2 * len(plain) >= len(late) else late


def steady_steps(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of `run_steps` that medians use (`steady_positions`)."""
    return [rows[i] for i in steady_positions([bool(r.get("instrument")) for r in rows])]


class SummaryBuilder:
    """Observes events (`observe`) and returns the `run_finished` summary (`summary`)."""

    def __init__(self) -> None:
        self.steps: dict[int, dict[int, dict]] = defaultdict(dict)  # rank -> step -> step event
        self.bucket_spans: dict[int, list[tuple[float, float]]] = defaultdict(list)  # rank-0 step -> spans
        self.bucket_unspanned: set[int] = set()  # rank-0 steps with a bucket whose all-reduce end is unknown
        self.dp_comm: dict[int, float] = defaultdict(float)
        self.peak: dict[str, int] = {}
        self.peak_training: dict[str, int] = {}  # device -> largest `peak_training_bytes` (CUDA), steps >= 1
        self.peak_training_first: dict[str, int] = {}  # the same on step 0 (its rise holds the workspaces)
        self.library_floor: dict[str, int] = {}  # device -> largest `library_floor_bytes` (CUDA)
        self.memory_sources: set[str] = set()
        self.volume: dict[str, dict[str, int]] = {}
        self.last_eval: dict | None = None
        self.sync: dict | None = None
        self.events_lost = 0
        self.gil: dict[str, dict[int, float | None]] = defaultdict(dict)  # device -> step -> share
        self.gil_sources: set[str] = set()
        self.gil_wait: dict[str, dict[int, float | None]] = defaultdict(dict)  # device -> step -> s
        self.dp_phase: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))  # step -> phase -> s

    def observe(self, e: dict[str, Any]) -> None:
        t = e.get("type")
        if t == "step":
            self.steps[e.get("rank", 0)][e["step"]] = e
        elif t == "bucket" and e.get("rank", 0) == 0:
            if e.get("comm_start_s") is not None and e.get("comm_end_s") is not None:
                self.bucket_spans[e["step"]].append((e["comm_start_s"], e["comm_end_s"]))
            else:  # a bucket whose all-reduce end was not measured (flight recorder on gloo)
                self.bucket_unspanned.add(e["step"])
        elif t == "memory":
            dev, peak = e["device"], e.get("peak_allocated_bytes")
            peak = peak if peak is not None else e.get("allocated_bytes")
            if peak is not None:
                self.peak[dev] = max(self.peak.get(dev, 0), int(peak))
                self.memory_sources.add(str(e.get("source")))
            if e.get("peak_training_bytes") is not None:  # CUDA: the peak less the library's floor
                # step 0 makes the libraries' workspaces inside the step (in its rise, not yet a
                # floor): the training's peak is read from later steps when there are any
                into = self.peak_training if e.get("step", 0) >= 1 else self.peak_training_first
                into[dev] = max(into.get(dev, 0), int(e["peak_training_bytes"]))
                self.library_floor[dev] = max(self.library_floor.get(dev, 0), int(e["library_floor_bytes"]))
        elif t == "comm_volume":
            self.volume[e["device"]] = {k: e.get(k) for k in VOLUME_KEYS if k in e}
        elif t == "eval":
            self.last_eval = e
        elif t == "sync":
            self.sync = e
        elif t == "log" and e.get("events_lost"):
            self.events_lost += int(e["events_lost"])
        elif t == "gil":
            self.gil[e["device"]][e["step"]] = e.get("gil_wait_share")
            self.gil_wait[e["device"]][e["step"]] = e.get("gil_wait_s")
            self.gil_sources.add(str(e.get("source")))
        elif t == "dp_phase" and str(e.get("device", "")).endswith(":0") and e.get("rank", 0) == 0:
            self.dp_phase[e["step"]][e["phase"]] += e["end_s"] - e["start_s"]  # device 0's, all micro-steps

    def _steady(self) -> list[dict]:
        return steady_steps(run_steps(e for by_step in self.steps.values() for e in by_step.values()))

    def overlap(self, steady_rows: Sequence[dict[str, Any]]) -> float | None:
        """1 − Σ exposed / Σ total comm over the steady steps `steady_rows` (`_steady()`) with buckets
        (None without comm); rank 0's buckets and exposed time."""
        total = exposed = 0.0
        rank0 = self.steps.get(0, {})
        steady = [rank0[r["step"]] for r in steady_rows if r["step"] in rank0]
        if any(e["step"] in self.bucket_unspanned for e in steady):
            # some steady steps' all-reduces were not timed (bucket_timing=recorder off the profiled
            # steps): a figure from the timed ones alone (early in a run, the profiled steps 0-2) would
            # stand for steps it never saw, and turn into "not measured" as the run goes on
            return None
        for e in steady:
            if e.get("comm_exposed_s") is None:  # not measured (FSDP on CUDA): no overlap figure
                continue
            spans = self.bucket_spans.get(e["step"])
            if spans:
                total += interval_union_s(spans)
                exposed += min(e.get("comm_exposed_s") or 0.0, interval_union_s(spans))
            elif (e.get("comm_exposed_s") or 0.0) > 0:  # DP: every copy is on the critical path
                total += e["comm_exposed_s"]
                exposed += e["comm_exposed_s"]
        return None if total <= 0 else max(0.0, 1.0 - exposed / total)

    @staticmethod
    def _median_by_device(per: dict[str, dict[int, float | None]], steady: Sequence[dict[str, Any]]
                          ) -> dict[str, float | None]:
        keep = {r["step"] for r in steady}
        out = {}
        for dev, by_step in sorted(per.items()):
            vals = [v for k, v in by_step.items() if k in keep and v is not None]
            out[dev] = statistics.median(vals) if vals else None
        return out

    def gil_wait_share(self, steady: Sequence[dict[str, Any]]) -> dict[str, float | None]:
        """Device -> median `gil_wait_share` over the steady steps it reported (None: not measured)."""
        return self._median_by_device(self.gil, steady)

    def dp_phase_s(self, steady: Sequence[dict[str, Any]]) -> dict[str, float]:
        """DP: phase -> median over the steady steps of device 0's time in it (seconds, summed over
        the step's micro-batches; measured `dp_phase` spans). Empty for other modes."""
        keep = [self.dp_phase[r["step"]] for r in steady if r["step"] in self.dp_phase]
        phases = sorted({p for by_phase in keep for p in by_phase})
        return {p: statistics.median(by_phase.get(p, 0.0) for by_phase in keep) for p in phases}

    def summary(self) -> dict[str, Any]:
        steady = self._steady()
        out: dict[str, Any] = {"steps_done": len(self.steps.get(0, {}))}
        for k in SPLIT_KEYS:
            vals = [e[k] for e in steady if e[k] is not None]
            out[k] = statistics.median(vals) if vals else None
        # DDP: each rank's loss is the mean over its own shard (equal sizes), so the global-batch
        # loss is the mean over ranks of their last step's loss.
        last = [self.steps[r][max(self.steps[r])] for r in self.steps if self.steps[r]]
        final_step = max((e["step"] for e in last), default=None)
        out["final_loss"], bad = mean_loss([e for e in last if e["step"] == final_step], "loss")
        if bad:
            out["final_loss_nonfinite"] = bad
        out["overlap"] = self.overlap(steady)  # the steady steps once, not again inside
        if out["overlap"] is None and self.bucket_unspanned & {e["step"] for e in steady}:
            out["overlap_note"] = OVERLAP_NOT_MEASURED
        if out["comm_exposed_s"] is None and any(e.get("comm_exposed_measured") is False for e in last):
            # the step's own reason where it gives one (DDP with bucket_timing=recorder on gloo is not CUDA)
            out["comm_exposed_note"] = next((e["comm_exposed_note"] for e in last if e.get("comm_exposed_note")),
                                            COMM_NOT_MEASURED)
        out["peak_memory_bytes"] = dict(sorted(self.peak.items()))
        training = {**self.peak_training_first, **self.peak_training}  # later steps win
        if self.peak:
            # the training's own peaks where a library's floor was measured (issue 31: four cuBLAS
            # workspaces on every GPU would make any imbalance look like 1.0x)
            peaks = training if set(training) == set(self.peak) else self.peak
            lo = min(peaks.values())
            out["memory_imbalance"] = max(peaks.values()) / lo if lo else None
            out["memory_source"] = ", ".join(sorted(self.memory_sources))
        if training:
            out["peak_training_bytes"] = dict(sorted(training.items()))
            out["library_floor_bytes"] = dict(sorted(self.library_floor.items()))
        out["bytes_per_device"] = dict(sorted(self.volume.items()))
        for k in ("val_loss", "val_accuracy"):
            out[k], bad = mean_loss([self.last_eval] if self.last_eval else [], k)
            if bad:
                out[k + "_nonfinite"] = bad
        out["replicas_in_sync"] = self.sync["in_sync"] if self.sync else None
        out["param_checksums"] = self.sync["checksums"] if self.sync else None
        out["events_lost"] = self.events_lost
        if self.sync is not None and "buffers_discarded" in self.sync:  # DP: engine/modes/dp/state.py
            out["buffers_discarded"] = self.sync["buffers_discarded"]
        out["gil_wait_share"] = self.gil_wait_share(steady)
        out["gil_wait_s"] = self._median_by_device(self.gil_wait, steady)
        out["gil_source"] = " | ".join(sorted(self.gil_sources)) or None
        out["dp_phase_s"] = self.dp_phase_s(steady)
        out.update(steady_samples(steady))
        keep = [self.dp_phase[r["step"]] for r in steady if r["step"] in self.dp_phase]
        out["dp_phase_mean_s"] = {p: statistics.fmean(by.get(p, 0.0) for by in keep)
                                  for p in sorted({p for by in keep for p in by})}
        return out


def steady_samples(steady: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What the verdict (`engine.verdict`) needs of a run's steady steps (rows of `run_steps`):

    - `steady_samples_per_s`: each steady step's samples/s, in step order (its bootstrap samples);
    - `steady_step_time_s`: each of those steps' time (s), in the same order (the mean gap's samples);
    - `steady_mean_s`: the mean over those steps of each of `STEP_PARTS` (seconds; means add up,
      medians do not), None for a part some step did not measure, and `untimed_s`: the mean of
      step time minus the timed parts (forward, backward, optimizer and, where measured, exposed
      comm): the part of the step no timer covered.
    """
    rows = [r for r in steady if r.get("samples_per_s") is not None]
    mean_s: dict[str, float | None] = {}
    for k in STEP_PARTS:
        vals = [r.get(k) for r in rows]
        mean_s[k] = None if not vals or any(v is None for v in vals) else statistics.fmean(vals)
    if rows:
        mean_s["untimed_s"] = statistics.fmean(
            r["step_time_s"] - sum(r.get(k) or 0.0 for k in STEP_PARTS if k != "step_time_s") for r in rows)
    return {"steady_samples_per_s": [round(r["samples_per_s"], 3) for r in rows],
            "steady_step_time_s": [round(r["step_time_s"], 7) for r in rows], "steady_mean_s": mean_s}
