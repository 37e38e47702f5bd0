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

A process has one profiler (Kineto's one session). An attached script that runs its own
(`torch.profiler.profile`, with or without a schedule) must keep it whole: starting ddpviz's inside the
script's left the script's with no events, and during its schedule's warm-up (prepared, not yet
recording, which no torch query shows) made the process crash at its next record (SIGSEGV, torch 2.13,
2026-12-06). So ddpviz stands aside for the rest of the process once the script has used one
(`watch_script_profiler` notes every start that is not ddpviz's), and whenever one is on
(`profiler_busy`); those sampled steps keep the reducer's ready times, their all-reduce times not measured.
"""

from __future__ import annotations

import functools
import os
import threading
from typing import Any, Callable

PROFILER_SOURCE = ("profiler, sampled step: ready = DDP's all-reduce launch (c10d::allreduce_), all-reduce start "
                   "and end = gloo:all_reduce on gloo's worker thread")
ORIGIN = "ddpviz:backward"
# where torch's profilers start Kineto or the legacy profiler: `profile._prepare_trace` / `_start_trace`
# (torch.autograd.profiler, read in torch 2.13), `emit_nvtx`/`emit_itt`, and the legacy profiler
WATCHED = (("torch.autograd.profiler", ("_prepare_profiler", "_enable_profiler")),
           ("torch.autograd.profiler_legacy", ("_enable_profiler_legacy",)))
SCRIPT_PROFILER = "the script runs PyTorch's profiler itself (a process has one; ddpviz's sampled steps stand aside)"
ON_DEMAND = ("Kineto's on-demand profiling is on (KINETO_USE_DAEMON): it may start the process's one profiler "
             "at any time")
UNWATCHED = "this torch's profiler entry points were not found, so the script's own profiling cannot be seen"
OTHER_DDP = ("another DDP's sampled step is being profiled by ddpviz in this backward (a process has one "
             "profiler)")
# the profile's all-reduces did not pair one to one with the buckets (`pair_spans`): under find_unused_parameters DDP
# all-reduces its map of used parameters too (a new user's trial, 2026-12-06)
UNPAIRED = ("the profiler's all-reduces did not pair one to one with the {n} bucket(s) (e.g. DDP's all-reduce of its "
            "used-parameter map under find_unused_parameters)")
_WATCH: dict[str, Any] = {"installed": False, "failed": False, "seen": False}
_OURS = threading.local()  # set while ddpviz itself starts a profiler
_RUNNING = {"n": 0}  # ddpviz's own profiles running now (`SampledSpans`)


def _noting(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def noted(*args: Any, **kwargs: Any) -> Any:
        if not getattr(_OURS, "on", False):
            _WATCH["seen"] = True
        return fn(*args, **kwargs)
    noted.__ddpviz_noting__ = True
    return noted


def watch_script_profiler() -> bool:
    """In an attached process, before the script runs: wrap torch's profiler entry points (`WATCHED`) so a
    profiler started by anyone but ddpviz is noted (`profiler_busy` then says so for good). Idempotent; the
    wrapped functions pass every argument and result through. Returns False (and ddpviz never profiles in
    this process) where one of them is missing in this torch."""
    import importlib

    if _WATCH["installed"] or _WATCH["failed"]:
        return _WATCH["installed"]
    found = []
    try:
        for module_name, names in WATCHED:
            module = importlib.import_module(module_name)
            found += [(module, n, getattr(module, n, None)) for n in names]
    except Exception:  # noqa: BLE001  (any failure: ddpviz never profiles here)
        found.append((None, "", None))
    if any(fn is None for _, _, fn in found):
        _WATCH["failed"] = True
        return False
    for module, name, fn in found:
        if not getattr(fn, "__ddpviz_noting__", False):
            setattr(module, name, _noting(fn))
    _WATCH["installed"] = True
    return True


def profiler_busy() -> str | None:
    """Why ddpviz must not start a profiler now (module docstring), or None."""
    import torch

    if _RUNNING["n"]:
        return OTHER_DDP
    if _WATCH["seen"] or getattr(torch.autograd.profiler, "_is_profiler_enabled", False) \
            or torch._C._autograd._profiler_enabled():
        return SCRIPT_PROFILER
    if os.environ.get("KINETO_USE_DAEMON"):
        return ON_DEMAND
    return UNWATCHED if _WATCH["failed"] else None


class SampledSpans:
    """Profiles one backward; `spans()` gives each bucket's (ready_s, comm_start_s, comm_end_s)."""

    def __init__(self) -> None:
        self._prof: Any = None
        self._range: Any = None
        self.stood_aside: str | None = None  # why the latest `start` profiled nothing (`profiler_busy`)

    @property
    def active(self) -> bool:
        return self._prof is not None

    def start(self) -> None:
        """Right before `backward()`; profiles nothing where `profiler_busy` says why (`stood_aside`)."""
        from torch.profiler import ProfilerActivity, profile, record_function

        self.stood_aside = profiler_busy()
        if self.stood_aside:
            return
        _OURS.on = True
        try:
            prof = profile(activities=[ProfilerActivity.CPU])
            prof.__enter__()
        finally:
            _OURS.on = False
        self._prof = prof
        _RUNNING["n"] += 1
        self._range = record_function(ORIGIN)
        self._range.__enter__()

    def stop(self) -> None:
        """Stop the profile (`spans` reads it after); alone, for one that will not be read (its step ended
        without reading it: an instrumentation part that raised). Left running, PyTorch's profiler outlived the
        step; at the process's exit it crashed the script (SIGSEGV after "Requested callback is not found", torch
        2.13, 2026-12-06)."""
        rng, prof, self._prof, self._range = self._range, self._prof, None, None
        if prof is not None:
            _RUNNING["n"] -= 1
        try:
            if rng is not None:
                rng.__exit__(None, None, None)
        finally:
            if prof is not None:
                prof.__exit__(None, None, None)

    def spans(self) -> list[tuple[float, float, float]] | None:
        """After the backward: per bucket in index order, or None when the launches and the
        collectives do not pair up (then nothing is claimed)."""
        prof = self._prof
        self.stop()
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
