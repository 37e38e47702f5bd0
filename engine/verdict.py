"""Who is ahead, DP or DDP, and why: one verdict from two run summaries, for every page and the CLI.

Torch-free (the app and `ddpviz compare` import it). Inputs are `run_finished` summaries
(`engine.summary.SummaryBuilder.summary`, or one built the same way from a running run's events),
so every figure is the summary's: medians over the steady steps (`engine.summary.steady_steps`).

The gap between the two step times is split into parts, each measured on the runs:

- `gil`: DP's device threads waiting for a lock (the GIL) minus DDP's ranks doing the same, mean
  over devices of the `gil` events' `gil_wait_s` (`engine.measure.gil`: wall − on-CPU − run-queue);
- `device0`: device 0's serial work DDP does not have: scatter, gather, the loss on the gathered
  output and the gradient reduce (DP's `dp_phase` spans on device 0; both modes run the optimizer);
- `rebuild`: DP building its replicas each step (the broadcast phase);
- `allreduce`: DDP's all-reduce left exposed after backward (`comm_exposed_s`), counted against DDP;
- `rest`: what remains of the gap (forward/backward compute and untimed time), derived as
  gap − the parts above, so the parts always sum to the gap.

References for the mechanisms: PyTorch's DDP notes ("DataParallel is single-process,
multi-thread ... slower than DDP even on a single machine due to GIL contention across threads,
per-iteration replicated model, and additional overhead introduced by scattering inputs and
gathering outputs") and Li et al., "PyTorch Distributed" (VLDB 2020) for bucketed overlap.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import mean
from typing import Any

LEVEL_WITHIN = 1.02  # a samples/s ratio within this of 1 is said to be level, not ahead
GIL_SMALL_SHARE = 0.02  # a GIL-wait share below this is said to be small
DEVICE0_PHASES = ("scatter", "gather", "loss", "reduce")
REBUILD_PHASES = ("broadcast",)
PART_NAMES = {
    "gil": "DP's device threads waiting for the GIL",
    "device0": "device 0's serial scatter, gather, loss and reduce",
    "rebuild": "rebuilding DP's replicas (broadcast)",
    "allreduce": "DDP's all-reduce left exposed after backward",
    "rest": "the rest (compute and untimed time, derived)",
}


@dataclass(frozen=True)
class Verdict:
    """DP vs DDP from their summaries.

    Attributes:
        leader: ``"ddp"``, ``"dp"`` or ``"level"`` (ratio within `LEVEL_WITHIN`).
        ratio: DDP samples/s ÷ DP samples/s (medians over steady steps).
        dp_step_ms, ddp_step_ms: median step times, ms.
        gap_ms: dp_step_ms − ddp_step_ms (positive: DP's step is longer).
        parts_ms: part -> ms of the gap it explains (`PART_NAMES`; positive lengthens DP's step
            relative to DDP's; they sum to `gap_ms`). Parts not measured are absent.
        gil_share: {"dp": max over DP's devices, "ddp": max over DDP's ranks} of the median
            GIL-wait share of the step (None where not measured).
        overlap: DDP's overlap (1 − exposed/total all-reduce time), None without buckets.
    """

    leader: str
    ratio: float
    dp_samples_per_s: float
    ddp_samples_per_s: float
    dp_step_ms: float
    ddp_step_ms: float
    gap_ms: float
    parts_ms: dict[str, float] = field(default_factory=dict)
    gil_share: dict[str, float | None] = field(default_factory=dict)
    overlap: float | None = None

    def headline(self) -> str:
        """One sentence: who is ahead and by how much."""
        if self.leader == "level":
            return (f"DP and DDP are level here: DDP at {self.ratio:.3f}× DP's samples/s, within "
                    f"{LEVEL_WITHIN - 1:.0%} (medians over steady steps).")
        if self.leader == "ddp":
            return (f"DDP is ahead: {self.ratio:.2f}× DP's samples/s ({self.ddp_samples_per_s:,.0f} vs "
                    f"{self.dp_samples_per_s:,.0f}, medians over steady steps).")
        return (f"DP is ahead here: {1 / self.ratio:.2f}× DDP's samples/s ({self.dp_samples_per_s:,.0f} vs "
                f"{self.ddp_samples_per_s:,.0f}, medians over steady steps).")

    def why(self) -> str:
        """The gap in measured parts, largest first, and the GIL shares side by side."""
        longer, by = ("DP's", self.gap_ms) if self.gap_ms >= 0 else ("DDP's", -self.gap_ms)
        sign = 1 if self.gap_ms >= 0 else -1
        named = sorted(((sign * v, k) for k, v in self.parts_ms.items()), reverse=True)
        parts = ", ".join(f"{PART_NAMES[k]} {v:+.2f} ms" for v, k in named if abs(v) >= 0.005)
        text = f"{longer} step is {by:.2f} ms longer" + (f": {parts}." if parts else ".")
        dp, ddp = self.gil_share.get("dp"), self.gil_share.get("ddp")
        if dp is not None:
            text += (f" DP's device threads waited for the GIL {dp:.0%} of the step"
                     + (f", DDP's ranks {ddp:.0%}" if ddp is not None else "") + " (measured: schedstat).")
            if dp < GIL_SMALL_SHARE:
                text += (" Small here: this model's ops run long enough in kernels that release the"
                         " GIL; narrow, deep models (Sweeps → shape) make it large.")
        if self.overlap is not None:
            text += f" DDP overlapped {self.overlap:.0%} of its all-reduce with backward."
        if self.leader == "dp":
            text += (" DP's copies are at RAM speed here (threads of one CPU process); on GPUs they "
                     "cross PCIe or NVLink through device 0, which DDP's all-reduce avoids.")
        return text

    def text(self) -> str:
        return f"{self.headline()} {self.why()}"


def _f(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if v == v else None  # NaN is no figure


def _mean_of(d: Any) -> float | None:
    vals = [v for v in (_f(x) for x in (d or {}).values()) if v is not None]
    return mean(vals) if vals else None


def _max_of(d: Any) -> float | None:
    vals = [v for v in (_f(x) for x in (d or {}).values()) if v is not None]
    return max(vals) if vals else None


def verdict(dp: dict[str, Any] | None, ddp: dict[str, Any] | None) -> Verdict | None:
    """The verdict from a DP run's summary and a DDP run's (None if either lacks samples/s or
    step time: a run that has not reached steady steps yet)."""
    if not dp or not ddp:
        return None
    a, b = _f(dp.get("samples_per_s")), _f(ddp.get("samples_per_s"))
    ta, tb = _f(dp.get("step_time_s")), _f(ddp.get("step_time_s"))
    if not a or not b or ta is None or tb is None:
        return None
    ratio = b / a
    leader = "level" if max(ratio, 1 / ratio) < LEVEL_WITHIN else ("ddp" if ratio > 1 else "dp")
    gap = (ta - tb) * 1e3
    parts: dict[str, float] = {}
    phases = dp.get("dp_phase_s") or {}
    if phases:
        parts["device0"] = sum(_f(phases.get(p)) or 0.0 for p in DEVICE0_PHASES) * 1e3
        parts["rebuild"] = sum(_f(phases.get(p)) or 0.0 for p in REBUILD_PHASES) * 1e3
    ga, gb = _mean_of(dp.get("gil_wait_s")), _mean_of(ddp.get("gil_wait_s"))
    if ga is not None:
        parts["gil"] = (ga - (gb or 0.0)) * 1e3
    exposed = _f(ddp.get("comm_exposed_s"))
    if exposed is not None:
        parts["allreduce"] = -exposed * 1e3
    parts["rest"] = gap - sum(parts.values())
    return Verdict(leader=leader, ratio=ratio, dp_samples_per_s=a, ddp_samples_per_s=b,
                   dp_step_ms=ta * 1e3, ddp_step_ms=tb * 1e3, gap_ms=gap, parts_ms=parts,
                   gil_share={"dp": _max_of(dp.get("gil_wait_share")),
                              "ddp": _max_of(ddp.get("gil_wait_share"))},
                   overlap=_f(ddp.get("overlap")))
