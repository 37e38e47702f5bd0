"""The GIL meter: how long a thread with Python work to do waited for a lock, measured (Linux).

Over a span of wall time, a thread is in one of three states, each counted by the kernel:

- on a CPU: the thread's CPU clock (`CLOCK_THREAD_CPUTIME_ID`, read with `time.thread_time_ns`
  inside the thread, or `time.pthread_getcpuclockid(ident)` from another);
- runnable, waiting in a run queue for a CPU: the second field of
  `/proc/self/task/<native_id>/schedstat` (`run_delay`, ns; Documentation/scheduler/sched-stats.rst);
- neither: asleep, i.e. blocked.

blocked = wall − on-CPU − runnable. Inside a span in which the thread has Python work to do (a
DP replica's forward, a DDP rank's step), blocked time is time spent waiting for a lock: in a
process with several Python threads mostly the Global Interpreter Lock, which every thread must
hold to run bytecode and which `torch` releases inside its kernels; but any other wait the span
contains (an intra-op thread pool's join, a collective, a condition) reads the same, which is
why a caller subtracts the waits it knows of (a DDP rank: its exposed all-reduce) and `source`
names what the figure may contain. A machine under load makes a thread wait for a CPU: that is
`runnable`, never counted as lock wait.

Readings taken inside the thread (the usual case) are exact up to the reading itself: the thread is
running, so its CPU clock is current and no run-queue wait is pending (the kernel adds a wait to
`run_delay` when it ends, `sched_info_arrive`). Read from another thread, a wait in progress is
counted only once it ends, so such a span can over-count blocked time by one run-queue wait.

Cost: one `ThreadClocks.read()` is `perf_counter`, `thread_time_ns`, a `pread` of the schedstat
file kept open, and parsing; a span is two readings. `ThreadClocks.cost_us()` measures it on the
machine at hand, and `ddpviz bench` records it (figure 5's `gil_reading_us`: 2.5-2.7 µs in three
tries on the 2-core development VM, loaded, CPython 3.11, 2026-12-04).

Inside a loaded training process a reading costs far more (34 µs median in a DDP rank here), so
the launched DDP ranks and CPU DP read only on sampled steps (`MeterGate`: the first 8, then
one in 32); the `gil` events' `source` says so.

Where `/proc/self/task/<tid>/schedstat` or the thread CPU clock is missing (not Linux, a kernel
without CONFIG_SCHED_INFO), the fields are None and `source` says why; a blocked time is never
reported without the run-queue wait subtracted.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from typing import Iterable, NamedTuple, Sequence

GIL_SOURCE = ("measured: blocked = wall − on-CPU (thread CPU clock) − run-queue wait "
              "(/proc/self/task/<tid>/schedstat) of the thread inside its own phases; a thread with "
              "Python work that neither runs nor waits for a CPU waits for a lock: the GIL, or another "
              "(intra-op thread pool, allocator)")

OWN_PHASES = ("forward", "backward")  # DP phases each device's own thread runs; the rest is the hub's


class ThreadClocks(NamedTuple):
    """One reading of one thread's clocks.

    Attributes:
        wall_s: `time.perf_counter()` seconds (the engine's `now()`).
        cpu_ns: the thread's on-CPU time, ns; None where the clock is missing.
        runq_ns: the thread's total run-queue wait (schedstat field 2), ns; None where missing.
        native_id: the kernel's thread id (`threading.get_native_id()`).
        missing: why a field is None ("" when none is).
    """

    wall_s: float
    cpu_ns: int | None
    runq_ns: int | None
    native_id: int
    missing: str = ""

    @classmethod
    def read(cls) -> "ThreadClocks":
        """The calling thread's clocks (its cost: see the module docstring)."""
        return _local_reader().read()

    @staticmethod
    def time_only() -> "ThreadClocks":
        """The wall clock alone, for a step the meter does not sample (`MeterGate`): no system call,
        no figures (`cpu_ns`, `runq_ns` None)."""
        return ThreadClocks(time.perf_counter(), None, None, 0, "not metered on this step")

    @staticmethod
    def cost_us(n: int = 2000) -> float:
        """Mean µs per `read()` over `n` readings, measured here."""
        reader = _local_reader()
        t = time.perf_counter()
        for _ in range(n):
            reader.read()
        return (time.perf_counter() - t) / n * 1e6


def _parse_runq(raw: bytes) -> int:
    fields = raw.split()
    if len(fields) < 2:
        raise ValueError(f"schedstat has {len(fields)} fields, need 2")
    return int(fields[1])


class ThreadReader:
    """Reads one thread's clocks; the schedstat file is opened once and re-read with `pread`.

    Args:
        thread: the thread to read (default: the calling thread). From another thread the CPU
            clock is `time.pthread_getcpuclockid(thread.ident)`.
    """

    def __init__(self, thread: threading.Thread | None = None):
        self.own = thread is None
        self.native_id = threading.get_native_id() if thread is None else thread.native_id
        self.missing: list[str] = []
        self._fd: int | None = None
        self._clock: int | None = None
        try:
            self._fd = os.open(f"/proc/self/task/{self.native_id}/schedstat", os.O_RDONLY)
            _parse_runq(os.pread(self._fd, 128, 0))
        except (OSError, ValueError) as exc:
            self._close()
            self.missing.append(f"run-queue wait: /proc/self/task/<tid>/schedstat unreadable ({exc})")
        if not self.own:
            try:
                self._clock = time.pthread_getcpuclockid(thread.ident)  # type: ignore[union-attr]
                time.clock_gettime_ns(self._clock)
            except (AttributeError, OSError, TypeError) as exc:
                self._clock = None
                self.missing.append(f"on-CPU time: time.pthread_getcpuclockid unavailable ({exc})")
        elif not hasattr(time, "thread_time_ns"):
            self.missing.append("on-CPU time: time.thread_time_ns unavailable")

    def _close(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None

    def __del__(self) -> None:  # a thread's reader dies with the thread (threading.local)
        self._close()

    def read(self) -> ThreadClocks:
        """The thread's clocks now."""
        wall = time.perf_counter()
        cpu = runq = None
        try:
            if self.own:
                cpu = time.thread_time_ns()
            elif self._clock is not None:
                cpu = time.clock_gettime_ns(self._clock)
        except (AttributeError, OSError):
            cpu = None
        if self._fd is not None:
            try:
                runq = _parse_runq(os.pread(self._fd, 128, 0))
            except (OSError, ValueError):
                runq = None  # the thread has ended
        return ThreadClocks(wall, cpu, runq, self.native_id, "; ".join(self.missing))


_LOCAL = threading.local()


def _local_reader() -> ThreadReader:
    r = getattr(_LOCAL, "reader", None)
    if r is None or r.native_id != threading.get_native_id():  # new thread, or a forked child
        r = _LOCAL.reader = ThreadReader()
    return r


class Span(NamedTuple):
    """One thread between two readings: where its wall time went (seconds).

    `blocked_s` = wall − on-CPU − runnable, at least 0; None where a clock is missing or the
    readings are of different threads (nothing can be said of a span two threads shared).
    """

    begin: ThreadClocks
    end: ThreadClocks

    @property
    def wall_s(self) -> float:
        return max(0.0, self.end.wall_s - self.begin.wall_s)

    @property
    def same_thread(self) -> bool:
        return self.begin.native_id == self.end.native_id

    @property
    def on_cpu_s(self) -> float | None:
        a, b = self.begin.cpu_ns, self.end.cpu_ns
        return None if a is None or b is None or not self.same_thread else max(0, b - a) / 1e9

    @property
    def runnable_s(self) -> float | None:
        a, b = self.begin.runq_ns, self.end.runq_ns
        return None if a is None or b is None or not self.same_thread else max(0, b - a) / 1e9

    @property
    def blocked_s(self) -> float | None:
        cpu, runq = self.on_cpu_s, self.runnable_s
        if cpu is None or runq is None:
            return None
        return max(0.0, self.wall_s - cpu - runq)

    @property
    def why_missing(self) -> str:
        if not self.same_thread:
            return "the span began and ended on different threads"
        return self.begin.missing or self.end.missing


class Measured:
    """Context manager: the calling thread's `Span` over the block (`.span` after it); with a
    `meter` (a `GilMeter`) whose gate is off this step, a wall-time-only span (`GilMeter.read`)."""

    def __init__(self, meter: "GilMeter | None" = None) -> None:
        self._read = meter.read if meter is not None else ThreadClocks.read

    def __enter__(self) -> "Measured":
        self._a = self._read()
        return self

    def __exit__(self, *exc) -> None:
        self.span = Span(self._a, self._read())


def span_fields(spans: Iterable[Span], step_wall_s: float, less_blocked_s: float = 0.0,
                note: str = "") -> dict:
    """The `gil` event's figures for one device's spans in one step.

    Args:
        spans: the spans the device's own threads ran this step (not overlapping in time); one
            that began and ended on different threads is left out.
        step_wall_s: the step's wall time, seconds (> 0).
        less_blocked_s: blocked time known to be another wait (a DDP rank's exposed all-reduce),
            taken off `gil_wait_s` (never below 0) and reported as `other_wait_s`.
        note: appended to `source` (what the spans are, what was taken off).

    Returns:
        `gil_wait_s`, `gil_wait_share` (of `step_wall_s`, in [0, 1]), `on_cpu_s`, `runnable_s`,
        `busy_s` (the spans' wall time), `thread_wait_s` (step wall − busy: the thread had no work
        of this device: waiting to be handed work, or doing other bookkeeping), `other_wait_s`,
        `source`; the measured fields None (and `source` saying why) where a clock is missing.
    """
    spans = [s for s in spans if s.same_thread]  # a span two threads shared is no thread's work
    busy = sum(s.wall_s for s in spans)
    missing = next((s.why_missing for s in spans if s.blocked_s is None), "")
    out = dict(busy_s=busy, thread_wait_s=max(0.0, step_wall_s - busy) if spans else None)
    if missing or not spans:
        out.update(gil_wait_s=None, gil_wait_share=None, on_cpu_s=None, runnable_s=None, other_wait_s=None,
                   source=f"unavailable: {missing or 'no span of this device was measured'}")
        return out
    blocked = sum(s.blocked_s for s in spans)  # type: ignore[misc]
    other = min(blocked, max(0.0, less_blocked_s))
    gil = blocked - other
    out.update(gil_wait_s=gil, gil_wait_share=min(1.0, gil / step_wall_s) if step_wall_s > 0 else None,
               on_cpu_s=sum(s.on_cpu_s for s in spans),  # type: ignore[misc]
               runnable_s=sum(s.runnable_s for s in spans),  # type: ignore[misc]
               other_wait_s=other, source=GIL_SOURCE + note)
    return out


class GilMeter:
    """One step's measured spans per (phase, device), and the `gil` figures they give.

    A DP span counts toward device d's step figure when d's own thread ran it: `OWN_PHASES` on
    every device, every phase on device 0 (broadcast, scatter, gather, loss, reduce, optimizer
    are device 0's serial work, run by the thread that drives the step). Thread-safe for `add`
    from several threads (a list append).
    """

    def __init__(self, gate: "MeterGate | None" = None) -> None:
        self.spans: list[tuple[str, int, Span]] = []
        self.gate = gate  # the steps it reads thread clocks on (None: every step)

    @property
    def on(self) -> bool:
        """Whether this step is metered (its spans kept, its `gil` events emitted)."""
        return self.gate is None or self.gate.on

    def begin_step(self, step: int | None = None) -> None:
        self.spans = []
        if self.gate is not None and step is not None:
            self.gate.begin_step(step)

    def read(self) -> ThreadClocks:
        """The calling thread's clocks on a metered step, else the wall clock alone."""
        return ThreadClocks.read() if self.on else ThreadClocks.time_only()

    def add(self, phase: str, device: int, span: Span) -> None:
        if self.on:
            self.spans.append((phase, device, span))

    @staticmethod
    def counts(phase: str, device: int) -> bool:
        """Whether a span of `phase` on `device` is that device's own thread's work."""
        return device == 0 or phase in OWN_PHASES

    def span_waits(self, keys: Sequence[tuple[str, int]]) -> list[float | None]:
        """Blocked seconds of each (phase, device) span in `keys`, matched in order of occurrence
        (the k-th span of a key to its k-th measurement); None for spans another thread ran on the
        device's behalf (device 0's copies to device j) or not measured."""
        queues: dict[tuple[str, int], list[Span]] = {}
        for phase, dev, span in self.spans:
            queues.setdefault((phase, dev), []).append(span)
        out = []
        for key in keys:
            q = queues.get(key)
            span = q.pop(0) if q else None
            out.append(span.blocked_s if span is not None and self.counts(*key) else None)
        return out

    def device_fields(self, n: int, step_wall_s: float) -> list[dict]:
        """`span_fields` for devices 0..n-1 from the spans each device's own thread ran, plus
        `phase_wait_s` ({phase: lock wait in seconds, summed over micro-steps}) where measured."""
        out = []
        note = self.gate.note() if self.gate is not None else ""
        for i in range(n):
            mine = [(p, s) for p, d, s in self.spans if d == i and self.counts(p, d) and s.same_thread]
            fields = span_fields([s for _, s in mine], step_wall_s, note=note)
            if fields["gil_wait_s"] is not None:
                waits: dict[str, float] = {}
                for p, s in mine:
                    waits[p] = waits.get(p, 0.0) + (s.blocked_s or 0.0)
                fields["phase_wait_s"] = waits
            out.append(fields)
        return out


END_READ_EVERY_S = 2e-4  # a key ended many times (once per parameter) reads its clocks at most this often


class MeteredBook:
    """Wraps an `engine.modes.dp.book.SpanBook`-like book: each `start`/`end` also reads the
    calling thread's clocks (first start kept, last end kept, as the book does), so the CUDA path
    measures its threads where its marks are taken. `meter_spans()` adds them to a `GilMeter`;
    a key whose start and end were read on different threads gives a span with no figures.

    A replica's backward ends once per parameter (the book keeps the last); to bound the cost
    (a few µs a reading) an end re-reads the clocks only `END_READ_EVERY_S` after the key's previous
    reading, so the measured span may stop up to 0.2 ms before the book's end."""

    def __init__(self, book) -> None:
        self.book = book
        self._reads: dict[tuple[str, int, int], list[ThreadClocks | None]] = {}

    def start(self, phase: str, device: int, micro: int, mark) -> None:
        slot = self._reads.setdefault((phase, device, micro), [None, None])
        if slot[0] is None:
            slot[0] = ThreadClocks.read()
        self.book.start(phase, device, micro, mark)

    def end(self, phase: str, device: int, micro: int, mark) -> None:
        slot = self._reads.setdefault((phase, device, micro), [None, None])
        last = slot[1]
        if last is None or time.perf_counter() - last.wall_s >= END_READ_EVERY_S \
                or last.native_id != threading.get_native_id():
            slot[1] = ThreadClocks.read()
        self.book.end(phase, device, micro, mark)

    def resolve(self, seconds):
        return self.book.resolve(seconds)

    def meter_spans(self, meter: GilMeter) -> None:
        for (phase, device, micro), (a, b) in sorted(self._reads.items(), key=lambda kv: kv[0][2]):
            if a is not None and b is not None:
                meter.add(phase, device, Span(a, b))


def median_share(shares: Iterable[float | None]) -> float | None:
    """Median of the measured shares (None ones left out); None when none is measured."""
    vals = [s for s in shares if s is not None]
    return statistics.median(vals) if vals else None


# A DDP rank (and CPU DP) reads its thread clocks on its first 8 steps, then on one step in 32 (`MeterGate`).
# One in 8 until 2026-12-06: with every step but the first unmetered (a scratch ablation, each ddpviz run between
# two plain ones) the small step's mean pace against plain DDP went 1.04-1.12x -> 0.99-1.00x (two tries each;
# docs/bench/small-step-bracketed-2026-12-06.json): a metered step takes the fully marked path, not only the reads.
METER_FIRST_STEPS, METER_EVERY_STEPS = 8, 32


class MeterGate:
    """Which steps the meter reads thread clocks on (a DDP rank's `MeteredClock`s, CPU DP's
    `GilMeter`): every step below `first`, then one in `every` (`step % every == 0`); the other
    steps' marks are time-only and no `gil` event is emitted for them (DP's `dp_phase` events then
    carry `gil_wait_s` null).

    Why: inside a training rank on the 2-core development VM a reading cost 34 µs (median over
    3,000 steps of 2 gloo ranks, MLP 128x3; `thread_time_ns` 7.4 µs, the schedstat `pread` 15 µs,
    each a system call at which the loaded scheduler may switch the thread out), against 4 µs in
    an idle process: five readings a step were ~4% of a 4.3 ms step, the instrument's largest
    per-step cost found (issue 31). Sampled, a rank pays it on one step in `every`.

    Args:
        every: the sampling period in steps (>= 1; 1 reads every step).
        first: the steps read at the start (default `METER_FIRST_STEPS`, at most `every`).
    """

    def __init__(self, every: int = METER_EVERY_STEPS, first: int = METER_FIRST_STEPS) -> None:
        self.every, self.on = max(1, every), True
        self.first = min(first, self.every)

    def begin_step(self, step: int) -> bool:
        """Set `on` for `step`; returns it."""
        self.on = step < self.first or step % self.every == 0
        return self.on

    def note(self) -> str:
        """What the `gil` events' `source` adds about the sampling."""
        return (f"; read on the first {self.first} steps and then on one step in {self.every} (a reading costs "
                "tens of µs in a loaded rank)") if self.every > 1 else ""
