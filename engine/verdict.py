"""Who is ahead, DP or DDP, by how much, how sure, and why: one verdict from two run summaries,
for every page and the CLI (`ddpviz compare --json`'s `verdict`).

Torch-free (the app and `ddpviz compare` import it). Inputs are summaries
(`engine.summary.SummaryBuilder.summary`: a run's `run_finished` summary, or one built the same way
from a running run's events, "so far"); every figure comes from their steady steps
(`engine.summary.steady_steps`: warm-up and instrumented steps left out).

The rule (the one place it lives):

- ratio = median samples/s of DDP's steady steps ÷ DP's (the summaries' `samples_per_s`);
- its 90% interval: a block bootstrap of each run's per-step samples/s
  (`engine.measure.bootstrap.ratio_interval`, blocks of up to `BLOCK_STEPS` consecutive steps, so
  the machine's drift over seconds stays inside each resample);
- DDP ahead when the interval's low end is above 1, DP ahead when its high end is below 1, else
  **level**: the two are level on this machine, within noise.

Within one run only: the interval does not hold the machine changing between the two runs (they
run one after the other); that is what repeating the pair measures (docs/bench/).

The gap between the mean step times (means add up; medians do not) is split into parts, each
measured once, on device 0 for DP and as the mean over ranks for DDP (the `step` events' fields):

- `compute`: forward + backward, DP's minus DDP's (DP's backward includes the loss on the gathered
  output on device 0; DDP's excludes the all-reduce left exposed after it);
- `rebuild`: DP rebuilding its replicas every step (device 0's `broadcast` spans);
- `device0`: device 0's serial copies DDP does not have (its `scatter`, `gather`, `reduce` spans);
- `optimizer`: DP's optimizer step minus DDP's;
- `allreduce`: DDP's all-reduce left exposed after backward (`comm_exposed_s`), against DDP;
  absent where DDP's exposed comm is not measured (null), its time then inside "not measured";
- not measured (`not_measured_ms`, never a cause): the time no timer covered, DP's minus DDP's
  (each run's mean of step time − its timed parts).

The GIL wait is *inside* those parts (a thread waiting for the lock does so within a phase), so it
is shown beside them, never added to them: `gil_wait_ms` (mean over devices of the `gil` events'
`gil_wait_s`, `engine.measure.gil`: wall − on-CPU − run-queue).

References: PyTorch's DDP notes ("DataParallel is single-process, multi-thread ... slower than DDP
even on a single machine due to GIL contention across threads, per-iteration replicated model, and
additional overhead introduced by scattering inputs and gathering outputs"); Li et al., "PyTorch
Distributed" (VLDB 2020) for bucketed overlap.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from ddpviz.engine.measure.bootstrap import mean_difference_interval, ratio_interval
from ddpviz.engine.measure.gil_rank import BACKWARD_LEFT_OUT, CUDA_BACKWARD
from ddpviz.engine.summary import OVERLAP_NOT_MEASURED, OVERLAP_NOT_MEASURED_SHORT

LEVEL = 0.90  # the interval's coverage
BLOCK_STEPS = 10  # at most this many consecutive steps per bootstrap block
MIN_BLOCKS = 5  # blocks shrink (to 1 step) so a short run still has this many
MIN_STEADY_STEPS = 6  # fewer steady steps in either run: no verdict yet
# the medians' gap is said beside the means' where they differ by more than both of these
MEDIAN_GAP_SAID_MS, MEDIAN_GAP_SAID_SHARE = 0.05, 0.1
BACKWARD_UNMETERED = (BACKWARD_LEFT_OUT, CUDA_BACKWARD)  # in a DDP rank's `gil` source: its backward not metered
GIL_SMALL_SHARE = 0.02  # a GIL-wait share below this is said to be small
DEVICE0_PHASES = ("scatter", "gather", "reduce")
REBUILD_PHASES = ("broadcast",)
PART_NAMES = {
    "compute": "forward and backward",
    "rebuild": "rebuilding DP's replicas (broadcast)",
    "device0": "device 0's serial scatter, gather and reduce",
    "optimizer": "the optimizer step",
    "allreduce": "DDP's all-reduce left exposed after backward",
}
SEPARATE = ("What would separate them: more steps (a longer run narrows the interval), a quieter "
            "machine (other work on the same cores moves each run's speed), or GPUs, where DP's broadcast "
            "and reduce through device 0 cross PCIe or NVLink while "
            "DDP's ring all-reduce splits the bytes between the links.")
# What the default pair did on a 2-core CPU, measured in turns (docs/bench/default-pair-b256-turns-tries.json,
# issue 33.3): said with every level or DP-ahead verdict, so a reader knows the machine, not the
# method, can decide.
CPU_FIGURES = ("the default pair (batch 256) "
               "measured in turns (`ddpviz compare --modes dp,ddp`) was DDP ahead beyond noise in 5 of 5 tries "
               "on a quiet machine both times (1.48-1.56x one morning, 1.31-1.66x one evening, the README's "
               "record) and, with one busy process beside it, ahead in 5 of 5 by less "
               "one morning (1.07-1.11x; the interval's low end below 1.05 once), by 1.39-1.50x one evening "
               "(docs/verdict.md): DDP's ranks meet at every all-reduce, so "
               "whichever rank the other process preempts holds up both, while DP's one process goes on with "
               "the core it has; smaller batches (32) were level or DP ahead there "
               "(docs/bench/default-pair-b256-turns-tries.json).")
CPU_NOTE = f"On 2 CPU cores the answer depends on whether the cores are free: {CPU_FIGURES}"
SOURCE = ("measured: ratio of the median samples/s over each run's steady steps; 90% interval from a "
          "block bootstrap of the per-step samples/s (engine.verdict); parts: means over steady steps")


@dataclass(frozen=True)
class Verdict:
    """DP vs DDP from their summaries (module docstring for every rule).

    Attributes:
        leader: "ddp", "dp" or "level" (the interval holds 1).
        ratio: DDP samples/s ÷ DP samples/s (medians over steady steps).
        interval: (lo, hi), the ratio's `LEVEL` block-bootstrap interval.
        steps: {"dp": n, "ddp": n} steady steps behind each median.
        dp_step_ms, ddp_step_ms: mean step times over the steady steps, ms.
        gap_ms: dp_step_ms − ddp_step_ms (positive: DP's step is longer).
        parts_ms: part -> ms of the gap (`PART_NAMES`; positive lengthens DP's step relative to
            DDP's), each measured once; parts a run did not measure are absent.
        not_measured_ms: the gap no timer covered (gap − parts; DP's untimed minus DDP's).
        not_measured_note: what that time holds, in words.
        gil_wait_ms: {"dp", "ddp"}: mean over devices of the GIL wait per step, ms (inside the
            parts, not one of them; None where not measured).
        gil_share: {"dp", "ddp"}: max over devices of the median GIL-wait share of the step.
        overlap: DDP's overlap (1 − exposed/total all-reduce time), None without buckets.
        overlap_note: why `overlap` is None where buckets were recorded (the summary's `overlap_note`).
        gap_interval_ms: the gap's `LEVEL` interval (ms): a block bootstrap of the two runs' steady step
            times (the summaries' `steady_step_time_s`), the difference of their means; None for summaries
            without them. The parts have none: each is a mean measured once.
        median_gap_ms: DP's median step time minus DDP's (ms, from the same step times), None without them:
            said beside the gap of the means where the two differ.
    """

    leader: str
    ratio: float
    interval: tuple[float, float]
    dp_samples_per_s: float
    ddp_samples_per_s: float
    steps: dict[str, int]
    dp_step_ms: float
    ddp_step_ms: float
    gap_ms: float
    parts_ms: dict[str, float] = field(default_factory=dict)
    not_measured_ms: float = 0.0
    not_measured_note: str = ""
    gil_wait_ms: dict[str, float | None] = field(default_factory=dict)
    gil_share: dict[str, float | None] = field(default_factory=dict)
    overlap: float | None = None
    overlap_note: str = ""
    gap_interval_ms: list[float] | None = None
    median_gap_ms: float | None = None
    # DDP's `gil` events leave its all-reducing backward out (no ready mark in the training thread:
    # bucket_timing=recorder, or CUDA): its GIL figure covers forward and the optimizer only
    ddp_backward_unmetered: bool = False

    def headline(self) -> str:
        """One sentence: who is ahead, by how much, and the interval."""
        lo, hi = self.interval
        n = f"medians over {self.steps['dp']} and {self.steps['ddp']} steady steps"
        if self.leader == "level":
            return (f"DP and DDP are level on this machine, within noise: DDP at {self.ratio:.2f}× DP's "
                    f"samples/s, and the {LEVEL:.0%} interval {lo:.2f}–{hi:.2f}× holds 1 ({n}). {SEPARATE}")
        if self.leader == "ddp":
            return (f"DDP is ahead: {self.ratio:.2f}× DP's samples/s, {LEVEL:.0%} interval {lo:.2f}–{hi:.2f}× "
                    f"({self.ddp_samples_per_s:,.0f} vs {self.dp_samples_per_s:,.0f}, {n}).")
        return (f"DP is ahead here: {1 / self.ratio:.2f}× DDP's samples/s, {LEVEL:.0%} interval "
                f"{1 / hi:.2f}–{1 / lo:.2f}× ({self.dp_samples_per_s:,.0f} vs {self.ddp_samples_per_s:,.0f}, {n}).")

    def why(self) -> str:
        """The gap in measured parts, largest first, what was not measured, and the GIL beside them."""
        longer, by = ("DP's", self.gap_ms) if self.gap_ms >= 0 else ("DDP's", -self.gap_ms)
        sign = 1 if self.gap_ms >= 0 else -1
        named = sorted(((sign * v, k) for k, v in self.parts_ms.items()), reverse=True)
        parts = "; ".join(f"{PART_NAMES[k]} {v:+.2f} ms" for v, k in named)
        # the leader by the medians has the longer mean step: a few slow steps (e.g. evaluation, a
        # preempted rank) weigh on the mean the parts add up to, not on the median the verdict compares
        disagree = (self.leader == "ddp" and self.gap_ms < 0) or (self.leader == "dp" and self.gap_ms > 0)
        m = self.median_gap_ms
        median_words = None if m is None else f"{'DP' if m >= 0 else 'DDP'}'s median step is {abs(m):.2f} ms longer"
        if disagree:  # the medians first, as the headline; then the means the parts split
            by_medians = median_words or f"{'DDP' if self.leader == 'ddp' else 'DP'} is ahead"
            text = (f"By the medians the verdict compares, {by_medians}; the means, which also count a few slow "
                    f"steps, make {longer} step {by:.2f} ms longer")
        else:
            text = f"{longer} mean step is {by:.2f} ms longer"
        if self.gap_interval_ms is not None:
            lo, hi = sorted(sign * x for x in self.gap_interval_ms)
            text += f" ({LEVEL:.0%} interval {lo:.2f}–{hi:.2f} ms"
            if lo <= 0:  # beside a decided verdict, not "within noise": the medians decided it
                text += (": it holds 0, within noise" if self.leader == "level" else
                         ": it reaches 0; the means, with their few slow steps, are noisier than the medians")
            elif self.leader == "level":  # the means differ beyond noise where the medians do not
                text += ": the means differ beyond noise; the medians, which the verdict compares, do not"
            if median_words and not disagree and abs(m - self.gap_ms) > max(
                    MEDIAN_GAP_SAID_MS, MEDIAN_GAP_SAID_SHARE * abs(self.gap_ms)):
                text += f"; {median_words}: the parts add up to the means"
            text += ")"
        text += f": {parts}" if parts else ""
        text += f"; not measured: {sign * self.not_measured_ms:+.2f} ms ({self.not_measured_note})."
        dp, ddp = self.gil_wait_ms.get("dp"), self.gil_wait_ms.get("ddp")
        if dp is not None:
            scope = " in forward and the optimizer (their all-reducing backward is not metered)" \
                if self.ddp_backward_unmetered else ""
            text += (f" Inside those parts, not added to them: DP's device threads waited for the GIL "
                     f"{dp:.2f} ms a step" + (f", DDP's ranks {ddp:.2f} ms{scope}" if ddp is not None else "")
                     + " (measured: schedstat).")
            share = self.gil_share.get("dp")
            if share is not None and share < GIL_SMALL_SHARE:
                text += (" Small here: this model's ops run long enough in kernels that release the"
                         " GIL; narrow, deep models (Sweeps → shape) make it large.")
        if self.overlap is not None:
            text += f" DDP overlapped {self.overlap:.0%} of its all-reduce with backward."
        elif self.overlap_note:  # the summary's note, in short where it is the recorder's
            short = OVERLAP_NOT_MEASURED_SHORT if self.overlap_note == OVERLAP_NOT_MEASURED else self.overlap_note
            text += f" DDP's overlap is {short}."
        if self.leader == "dp":
            text += (" DP's copies are at RAM speed here (threads of one CPU process); on GPUs they "
                     "cross PCIe or NVLink through device 0, which DDP's all-reduce avoids.")
        if self.leader == "dp":
            text += f" {CPU_NOTE}"
        elif self.leader == "level":  # the headline already named a quieter machine: the figures only
            text += f" For scale, {CPU_FIGURES}"
        return text

    def text(self) -> str:
        return f"{self.headline()} {self.why()}"

    def to_json(self) -> dict[str, Any]:
        """`ddpviz compare --json`'s top-level `verdict` (README, "Command line")."""
        d = asdict(self)
        del d["leader"], d["ratio"], d["interval"]
        return {"winner": self.leader, "ratio": self.ratio, "interval": list(self.interval), "level": LEVEL,
                **d, "text": self.text(), "source": SOURCE}


def _f(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if v == v else None  # NaN is no figure


def _mean_of(d: Any) -> float | None:
    vals = [v for v in (_f(x) for x in (d or {}).values()) if v is not None]
    return statistics.fmean(vals) if vals else None


def _max_of(d: Any) -> float | None:
    vals = [v for v in (_f(x) for x in (d or {}).values()) if v is not None]
    return max(vals) if vals else None


def block_for(n: int) -> int:
    """Bootstrap block length for a run of `n` steady steps: `BLOCK_STEPS`, shorter so that
    there are at least `MIN_BLOCKS` blocks, never below 1."""
    return max(1, min(BLOCK_STEPS, n // MIN_BLOCKS))


def leader_of(interval: tuple[float, float]) -> str:
    """"ddp" when the ratio's interval is above 1, "dp" when below, else "level"."""
    lo, hi = interval
    return "ddp" if lo > 1 else "dp" if hi < 1 else "level"


def gap_parts(dp: dict[str, Any], ddp: dict[str, Any]) -> tuple[dict[str, float], float, str] | None:
    """(parts_ms, not_measured_ms, its note) of the gap between the mean steps (module docstring);
    None when either summary lacks `steady_mean_s`."""
    a, b = dp.get("steady_mean_s") or {}, ddp.get("steady_mean_s") or {}
    if _f(a.get("step_time_s")) is None or _f(b.get("step_time_s")) is None:
        return None
    ms = lambda m, k: (_f(m.get(k)) or 0.0) * 1e3  # noqa: E731  (a part the run did not time: 0, and in untimed)
    parts = {"compute": ms(a, "forward_s") + ms(a, "backward_s") - ms(b, "forward_s") - ms(b, "backward_s"),
             "optimizer": ms(a, "optimizer_s") - ms(b, "optimizer_s")}
    phases = dp.get("dp_phase_mean_s") or {}
    if phases:
        parts["rebuild"] = sum(_f(phases.get(p)) or 0.0 for p in REBUILD_PHASES) * 1e3
        parts["device0"] = sum(_f(phases.get(p)) or 0.0 for p in DEVICE0_PHASES) * 1e3
    elif _f(a.get("comm_exposed_s")):
        parts["device0"] = ms(a, "comm_exposed_s")
    note = "time between the timed phases: Python, data loading, waits"
    if _f(b.get("comm_exposed_s")) is None:
        note += "; DDP's exposed all-reduce, not measured on this run, is in it"
    else:
        parts["allreduce"] = -ms(b, "comm_exposed_s")
    return parts, ms(a, "untimed_s") - ms(b, "untimed_s"), note


def verdict(dp: dict[str, Any] | None, ddp: dict[str, Any] | None) -> Verdict | None:
    """The verdict from a DP run's summary and a DDP run's; None until both have
    `MIN_STEADY_STEPS` steady steps with samples/s (`steady_samples_per_s`) and `steady_mean_s`."""
    if not dp or not ddp:
        return None
    xa, xb = dp.get("steady_samples_per_s") or [], ddp.get("steady_samples_per_s") or []
    split = gap_parts(dp, ddp)
    if min(len(xa), len(xb)) < MIN_STEADY_STEPS or split is None or min(min(xa), min(xb)) <= 0:
        return None
    a, b = statistics.median(xa), statistics.median(xb)
    lo, hi = ratio_interval(xb, xa, block_for(len(xb)), block_for(len(xa)), level=LEVEL)
    parts, untimed, note = split
    ta, tb = dp["steady_mean_s"]["step_time_s"] * 1e3, ddp["steady_mean_s"]["step_time_s"] * 1e3
    sa, sb = dp.get("steady_step_time_s") or [], ddp.get("steady_step_time_s") or []
    gap_interval = median_gap = None
    if min(len(sa), len(sb)) >= MIN_STEADY_STEPS:
        gap_interval = [x * 1e3 for x in mean_difference_interval(sa, sb, block_for(len(sa)), block_for(len(sb)),
                                                                   level=LEVEL)]
        median_gap = (statistics.median(sa) - statistics.median(sb)) * 1e3
    return Verdict(leader=leader_of((lo, hi)), ratio=b / a, interval=(lo, hi), dp_samples_per_s=a,
                   ddp_samples_per_s=b, steps={"dp": len(xa), "ddp": len(xb)}, dp_step_ms=ta, ddp_step_ms=tb,
                   gap_ms=ta - tb, parts_ms=parts, not_measured_ms=untimed, not_measured_note=note,
                   gil_wait_ms={m: (None if g is None else g * 1e3) for m, g in
                                (("dp", _mean_of(dp.get("gil_wait_s"))), ("ddp", _mean_of(ddp.get("gil_wait_s"))))},
                   gil_share={"dp": _max_of(dp.get("gil_wait_share")), "ddp": _max_of(ddp.get("gil_wait_share"))},
                   overlap=_f(ddp.get("overlap")), overlap_note=str(ddp.get("overlap_note") or ""),
                   gap_interval_ms=gap_interval, median_gap_ms=median_gap,
                   ddp_backward_unmetered=any(k in str(ddp.get("gil_source") or "") for k in BACKWARD_UNMETERED))
