"""Full bucket spans on sampled steps of a DDP with no comm hook (gloo), from PyTorch's profiler.

With no comm hook (`bucket_timing="recorder"`, `engine.modes.ddp.flight`) no Python runs per bucket,
so an ordinary step has no bucket times on gloo. On sampled steps (the memory-traced ones: their
times already carry the instrument's work and the summary's medians leave them out) the backward
runs under `torch.profiler.profile` (CPU activity), which records, with no hook:

- `c10d::allreduce_` on the training thread when DDP's reducer launched a bucket — the moment it (and
  every bucket before it) was ready: `ready_s`. The dispatcher's op and the backend's implementation
  both carry that name, nested: the outer one counts;
- `gloo:all_reduce` on gloo's worker threads, from when a worker began the collective to its end:
  `comm_start_s`, `comm_end_s`. Gloo's workers take queued collectives in order, so the k-th by
  start is bucket k (DDP launches buckets in index order, `Reducer::mark_bucket_ready`).

Times are seconds from the `ddpviz:backward` range opened right before `backward()`. Cost: the
profiled backward is slower, and reading its events (`kineto_rows`, raw, not `prof.events()`'s tree)
0.5-5 ms here, paid on sampled steps only. CUDA is not handled here (no profiler runs there: `LayoutBuckets`).
"""

from __future__ import annotations

from typing import Any

PROFILER_SOURCE = ("profiler, sampled step: ready = DDP's all-reduce launch (c10d::allreduce_), all-reduce start "
                   "and end = gloo:all_reduce on gloo's worker thread")
ORIGIN = "ddpviz:backward"


class SampledSpans:
    """Profiles one backward; `spans()` gives each bucket's (ready_s, comm_start_s, comm_end_s)."""

    def __init__(self) -> None:
        self._prof: Any = None
        self._range: Any = None

    @property
    def active(self) -> bool:
        return self._prof is not None

    def start(self) -> None:
        """Right before `backward()`."""
        from torch.profiler import ProfilerActivity, profile, record_function

        self._prof = profile(activities=[ProfilerActivity.CPU])
        self._prof.__enter__()
        self._range = record_function(ORIGIN)
        self._range.__enter__()

    def spans(self) -> list[tuple[float, float, float]] | None:
        """After the backward: per bucket in index order, or None when the launches and the
        collectives do not pair up (then nothing is claimed)."""
        self._range.__exit__(None, None, None)
        self._prof.__exit__(None, None, None)
        prof, self._prof, self._range = self._prof, None, None
        return pair_spans(kineto_rows(prof))


def kineto_rows(prof: Any) -> list[tuple[str, float, float]]:
    """(name, start_us, end_us) of every event a stopped `torch.profiler.profile` recorded, read from
    Kineto's raw results (`prof.profiler.kineto_results.events()`: name, start and duration in ns)
    rather than `prof.events()`, which builds a `FunctionEvent` tree first: 0.45 against 4.5 ms for
    a small MLP's backward (220 events), 5.1 against 57 ms for 48 layers (2,605 events), one gloo
    rank here. Where this torch's raw events lack those fields, `prof.events()` (the same times)."""
    try:
        return [(e.name(), e.start_ns() / 1e3, (e.start_ns() + e.duration_ns()) / 1e3)
                for e in prof.profiler.kineto_results.events()]
    except (AttributeError, TypeError):
        return [(e.name, e.time_range.start, e.time_range.end) for e in prof.events()]


def pair_spans(events: list[tuple[str, float, float]]) -> list[tuple[float, float, float]] | None:
    """(name, start_us, end_us) profiler events -> per bucket (ready_s, comm_start_s, comm_end_s),
    seconds from the `ORIGIN` range's start (module docstring); None if they do not pair up."""
    origin = next((s for n, s, _ in events if n == ORIGIN), None)
    calls = sorted((s, e) for n, s, e in events if n == "c10d::allreduce_")
    launches, outer_end = [], float("-inf")
    for s, e in calls:  # the op and its backend's implementation nest under one name: keep the outer
        if s >= outer_end:
            launches.append(s)
            outer_end = e
    runs = sorted((s, e) for n, s, e in events if n == "gloo:all_reduce")
    if origin is None or not launches or len(launches) != len(runs):
        return None
    return [((r - origin) / 1e6, (s - origin) / 1e6, (e - origin) / 1e6) for r, (s, e) in zip(launches, runs)]
