"""A whole run's throughput and memory readings, kept in bins so Live draws the whole run.

`ReadingHistory` does the same for the memory timer's readings (`memory_readings` events): per
device and source, bins of `bin_s` seconds (doubling when they outgrow `MAX_BINS`), each with the
count, mean, min and max of the bytes read in it. The window never keeps those events themselves.

`RunWindow` keeps the newest steps' events (its window); the steps it drops are folded here,
each step once: samples/s = samples / the mean of its ranks' step times (as `app.frames.steps.steps_frame`).
A bin covers `bin_steps` consecutive steps and keeps the count, mean, min and max of their
samples/s — numbers that merge exactly, so when the bins outgrow `MAX_BINS` two neighbours
become one (`bin_steps` doubles) without losing anything they report. Memory stays bounded
whatever the run's length: at most `MAX_BINS` bins.

Pure (no Streamlit, no I/O).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import pandas as pd

from ddpviz.app.frames.memory import SHARED_PROCESS

MAX_BINS = 240  # bins kept per run; ~one per 2 px of a chart's width
BIN_COLUMNS = ["run", "step_lo", "step_hi", "step_mid", "steps", "mean", "lo", "hi", "bin_steps"]


@dataclass
class Bin:
    """samples/s of the steps in one bin: how many, their sum, min and max."""

    count: int = 0
    total: float = 0.0
    lo: float = float("inf")
    hi: float = float("-inf")
    first: int | None = None  # the bin's first and last step seen
    last: int | None = None

    def add(self, value: float, step: int) -> None:
        self.count, self.total = self.count + 1, self.total + value
        self.lo, self.hi = min(self.lo, value), max(self.hi, value)
        self.first = step if self.first is None else min(self.first, step)
        self.last = step if self.last is None else max(self.last, step)

    def merge(self, other: "Bin") -> None:
        self.count, self.total = self.count + other.count, self.total + other.total
        self.lo, self.hi = min(self.lo, other.lo), max(self.hi, other.hi)
        firsts = [s for s in (self.first, other.first) if s is not None]
        lasts = [s for s in (self.last, other.last) if s is not None]
        self.first, self.last = (min(firsts) if firsts else None), (max(lasts) if lasts else None)


def step_rates(events: Iterable[dict[str, Any]]) -> dict[int, float]:
    """{step: samples/s} of `step` events, a step's time being the mean of its ranks' (why:
    `app.frames.steps.steps_frame`)."""
    per: dict[int, tuple[float, float, int]] = {}
    for e in events:
        if e.get("type", "step") != "step" or not isinstance(e.get("step"), int):
            continue
        samples, total, ranks = per.get(e["step"], (0.0, 0.0, 0))
        per[e["step"]] = (max(samples, e.get("samples") or 0), total + (e.get("step_time_s") or 0.0), ranks + 1)
    return {s: samples / (t / k) for s, (samples, t, k) in per.items() if t > 0}


class StepHistory:
    """Binned samples/s of the steps folded in so far (see module docstring)."""

    def __init__(self, max_bins: int = MAX_BINS):
        self.max_bins = max_bins
        self.bin_steps = 1
        self.bins: dict[int, Bin] = {}
        self.last_step = -1  # newest step folded in

    def add(self, events: Iterable[dict[str, Any]]) -> None:
        """Fold in the `step` events of whole steps (every rank's event of each step)."""
        for step, rate in sorted(step_rates(events).items()):
            self.bins.setdefault(step // self.bin_steps, Bin()).add(rate, step)
            self.last_step = max(self.last_step, step)
        while len(self.bins) > self.max_bins:
            self._coarsen()

    def _coarsen(self) -> None:
        merged: dict[int, Bin] = {}
        for index, b in sorted(self.bins.items()):
            merged.setdefault(index // 2, Bin()).merge(b)
        self.bins, self.bin_steps = merged, self.bin_steps * 2

    def frame(self, run: str) -> pd.DataFrame:
        """One row per bin: run, step_lo/step_hi (its first and last step), step_mid, steps (how
        many), mean, lo, hi (samples/s), bin_steps (the bins' width in steps)."""
        rows = [{"run": run, "step_lo": b.first, "step_hi": b.last, "step_mid": (b.first + b.last) / 2,
                 "steps": b.count, "mean": b.total / b.count, "lo": b.lo, "hi": b.hi,
                 "bin_steps": self.bin_steps} for _, b in sorted(self.bins.items())]
        return pd.DataFrame(rows, columns=BIN_COLUMNS)


class ReadingHistory:
    """Binned memory readings of a run, per (device, source) (see the module docstring).

    Args:
        max_bins: bins kept per (device, source); the bins double in width beyond it.
        bin_s: the first bins' width in seconds (> 0).

    Raises:
        ValueError: bin_s not > 0.
    """

    def __init__(self, max_bins: int = MAX_BINS, bin_s: float = 0.25):
        if not bin_s > 0:
            raise ValueError(f"bin_s must be > 0 (got {bin_s})")
        self.max_bins, self.bin_s = max_bins, bin_s
        self.series: dict[tuple[str, str], dict[int, Bin]] = {}
        self.readings = 0  # readings folded in

    def add(self, event: dict[str, Any]) -> None:
        """Fold in one `memory_readings` event (docs/events.md): `reading_ts` and `bytes` per source."""
        device = f"{event['host']}/{event.get('device')}" if event.get("host") else str(event.get("device"))
        ts = event.get("reading_ts") or []
        for source, values in (event.get("bytes") or {}).items():
            # DP's devices share one process: its RSS is one series, whichever device's timer read it (the
            # tour, issue 33: two lines for one process), named as the step's chart names it
            shared = source == "process" and event.get("process_shared")
            where = (f"{event['host']}/{SHARED_PROCESS}" if event.get("host") else SHARED_PROCESS) if shared else device
            bins = self.series.setdefault((where, source), {})
            for t, b in zip(ts, values):
                if b is not None:
                    bins.setdefault(int(t // self.bin_s), Bin()).add(float(b), t)
                    self.readings += 1
        while any(len(b) > self.max_bins for b in self.series.values()):
            self._coarsen()

    def _coarsen(self) -> None:
        for key, bins in self.series.items():
            merged: dict[int, Bin] = {}
            for index, b in sorted(bins.items()):
                merged.setdefault(index // 2, Bin()).merge(b)
            self.series[key] = merged
        self.bin_s *= 2

    def rows(self) -> list[dict[str, Any]]:
        """One dict per bin: device, source, first_ts/last_ts (unix s of its first and last
        reading), readings, mean_bytes, lo_bytes, hi_bytes, bin_s."""
        return [{"device": device, "source": source, "first_ts": b.first, "last_ts": b.last,
                 "readings": b.count, "mean_bytes": b.total / b.count, "lo_bytes": b.lo, "hi_bytes": b.hi,
                 "bin_s": self.bin_s}
                for (device, source), bins in sorted(self.series.items()) for _, b in sorted(bins.items())]
