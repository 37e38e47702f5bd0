"""The memory sampler: a timer reading every device >= 10 times a second, and traced steps.

Two measurements, both of the run itself:

- **The timer** (`engine.measure.memory_timer`, a daemon thread, every `SAMPLE_INTERVAL_S`) reads
  the cheap counters of every device: process RSS (psutil; `process`), the CUDA caching allocator
  (`cuda`), NVML's used memory of the same GPU by UUID (`nvml`), and the live-tensor ledger while a
  step is traced (`tensors`), and publishes them as they are taken (`memory_readings` events, at
  most every half second). It also reads them at the start and end of every traced step.
- **Traced steps** (`should_trace_memory`: steps 0-2, every 200th or sparser (at most
  `TRACE_STEPS_PER_RUN` more), and the last) run inside a `LedgerMode`, so the ledger knows the
  bytes of every tensor storage each device holds at every moment of the step, by kind. On CUDA
  the allocator's peak is reset at the step's start. Other steps pay nothing but the timer
  thread's wake-ups.

After a traced step one `memory` event per device carries the step's measured peak, the within-step
curve of every source (seconds from the step's start), the breakdown by kind at the peak, and the
timer's own figures since the previous event (readings, seconds, peak per source), so the sampling
rate and what happened between traced steps are in the record too. Field by field: docs/events.md.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterable, Iterator

import torch
import torch.nn as nn

from ddpviz.engine.config import RunConfig
from ddpviz.engine.events import AFTER_STEP_PHASE
from ddpviz.engine.measure.ledger import LedgerMode, TensorLedger
from ddpviz.engine.measure.memory import NvmlReader, cuda_allocator, optimizer_state_tensors, step_memory_parts
from ddpviz.engine.measure.memory_timer import SAMPLE_INTERVAL_S, DeviceProbe, MemoryTimer  # noqa: F401 (re-exported)
from ddpviz.engine.measure.telemetry import Telemetry, now, wall_ts

TRACE_STEPS_PER_RUN = 20  # traced steps spread over a run, besides steps 0-2 and the last
# At least this many steps between two traced steps. A traced step runs the ledger over every tensor op
# and, on gloo, the profiler: the median step is not moved by them, but the run's pace is. Measured
# 2026-12-05 night (`ddpviz train`, DDP mlp 128x3, batch 64, 2 gloo ranks, 400 steps, rank 0's events):
# traced steps 19-34 ms against a 7.4 ms median step, at 1 in 50 4.8% of the run's wall time (0.17 s
# of 3.53 s); at 1 in 200 that is ~1.2% (derived from the same figures). Before: 1 in 7 at 150 steps
# moved the median 11% (the overhead bench's figure).
TRACE_MIN_GAP_STEPS = 200
CURVE_POINTS = 240  # most points one source's curve keeps in one event (min and max per bin)
MIN_AFTER_STEP_S = 1e-4  # a shorter tail after a traced step's last phase is not drawn as a phase

Existing = Callable[[], Iterable[tuple[int, str, Iterable[torch.Tensor | None]]]]


def should_trace_memory(step: int, steps: int) -> bool:
    """Trace steps 0-2 (first allocations, DDP's bucket rebuild), every k-th step with
    k = max(`TRACE_MIN_GAP_STEPS`, steps // `TRACE_STEPS_PER_RUN`), and the last: the same steps
    on every rank, so their curves compare. At most ~20 mid-run traced steps, never 2 within
    `TRACE_MIN_GAP_STEPS`."""
    gap = max(TRACE_MIN_GAP_STEPS, steps // TRACE_STEPS_PER_RUN)
    return step < 3 or step == steps - 1 or step % gap == 0


class MemorySampler:
    """Reads memory on a timer and traces chosen steps; emits `memory` events.

    Args:
        tel: where events go (`rank` comes from it; `device` from each probe).
        devices: the devices to report.
        steps: the run's steps (for `should_trace_memory`).
        ledger: the live-tensor ledger, or None (no `tensors` figures).
        existing: returns ``(ledger device, kind, tensors)`` triples of the tensors alive at a
            traced step's start (parameters, gradients, optimizer state, buffers...).
        hooks: a context manager factory entered around a traced step (e.g. `phase_hooks`).
        phases_of: device index -> that device's ``[phase, start s, end s]`` spans of the step
            just run (perf_counter seconds); default: forward, backward and optimizer placed
            from the step's own measured durations (`step_phases`).
        nvml: NVML reader (CUDA only).
        interval_s: timer period, seconds (`engine.measure.memory_timer.MemoryTimer`, which also
            publishes every reading as `memory_readings` events).

    Use `wrap(train_step)` as the step function, and `close()` when the run ends.
    """

    def __init__(self, tel: Telemetry, devices: list[DeviceProbe], steps: int,
                 ledger: TensorLedger | None = None, existing: Existing | None = None,
                 hooks: Callable[[], Any] | None = None, nvml: NvmlReader | None = None,
                 interval_s: float = SAMPLE_INTERVAL_S,
                 phases_of: Callable[[int], list[tuple[str, float, float]]] | None = None):
        self.tel, self.devices, self.steps, self.ledger = tel, devices, steps, ledger
        self.existing, self.hooks, self.interval_s, self.phases_of = existing, hooks, interval_s, phases_of
        self._last_fields: dict[str, Any] = {}
        # CUDA device -> (allocated, the ledger's bytes) at a traced step's start
        self._held_start: dict[str, tuple[int, int]] = {}
        self._window_start = now()
        self.timer = MemoryTimer(tel, devices, nvml=nvml, interval_s=interval_s, extra=self._ledger_reading)
        self._lock = self.timer.lock

    # ---- the timer (engine.measure.memory_timer) ---------------------------------------------------
    def _ledger_reading(self, probe: DeviceProbe) -> dict[str, int]:
        led = self.ledger
        if led is not None and led.active and probe.ledger_index is not None:
            return {"tensors": led.totals[probe.ledger_index]}
        return {}

    def tick(self) -> float:
        """Read every device now (the timer calls this; so does each traced step's start and end)."""
        return self.timer.tick()

    def close(self) -> None:
        """Stop the timer thread and publish its last readings."""
        self.timer.close()

    # ---- traced steps ----------------------------------------------------------------------------
    def wrap(self, train_step: Callable[[int], dict[str, Any]]) -> Callable[[int], dict[str, Any]]:
        """`train_step` with memory traced on the steps `should_trace_memory` picks; those steps'
        fields get ``memory_traced=True`` (their time includes the tracing)."""
        def step_fn(step: int) -> dict[str, Any]:
            if not should_trace_memory(step, self.steps):
                return train_step(step)
            with self.traced(step):
                fields = self._last_fields = train_step(step)
            fields["memory_traced"] = True
            return fields
        return step_fn

    @contextlib.contextmanager
    def traced(self, step: int) -> Iterator[None]:
        """Trace the block as step `step`; emits the `memory` events when it ends without error."""
        led = self.ledger
        baseline = self._begin()
        ctx = contextlib.ExitStack()
        if led is not None:
            ctx.enter_context(LedgerMode(led, device=0))
        if self.hooks is not None:
            ctx.enter_context(self.hooks())
        t0 = self.tick()
        ok = False
        try:
            with ctx:
                yield
            ok = True
        finally:
            t1 = self.tick()
            if led is not None:
                led.end()
            if ok:
                self._emit(step, t0, t1, baseline)

    def _begin(self) -> list[int]:
        """Reset peaks, count the tensors alive now; returns where each device's curve starts."""
        for p in self.devices:
            if p.cuda_index is not None:
                torch.cuda.reset_peak_memory_stats(p.cuda_index)
        led = self.ledger
        if led is None:
            return []
        led.begin()
        for dev, kind, tensors in (self.existing() if self.existing else ()):
            if isinstance(tensors, int):  # bytes held where no tensor is reachable (`TensorLedger.add_held`)
                led.add_held(tensors, kind, device=dev)
            else:
                led.add_existing(tensors, kind, device=dev)
        self._held_start = {p.name: (int(torch.cuda.memory_allocated(p.cuda_index)), led.totals[p.ledger_index])
                            for p in self.devices if p.cuda_index is not None and p.ledger_index is not None}
        return [len(pts) for pts in led.points]

    def _emit(self, step: int, t0: float, t1: float, baseline: list[int]) -> None:
        with self._lock:
            window_s, self._window_start = t1 - self._window_start, t1
            for p in self.devices:
                self.tel.emit("memory", step=step, device=p.name,
                              **self._fields(p, t0, t1, baseline, window_s))
                p.window_count, p.window_peak = 0, {}

    def _fields(self, p: DeviceProbe, t0: float, t1: float, baseline: list[int],
                window_s: float) -> dict[str, Any]:
        curve: dict[str, list[list[float]]] = {}
        for t, r in p.readings:
            if t0 <= t <= t1:
                for src, b in r.items():
                    if src != "tensors":
                        curve.setdefault(src, []).append([round(t - t0, 6), b])
        last = next((r for t, r in reversed(p.readings) if t <= t1), {})
        f: dict[str, Any] = dict(step_span_s=t1 - t0, process_rss_bytes=last.get("process"),
                                 process_shared=p.process_shared, reserved_bytes=None,
                                 used_bytes=last.get("nvml"), breakdown={})
        led, i = self.ledger, p.ledger_index
        if led is not None and i is not None:
            pts = [(t0, led.points[i][baseline[i] - 1][1] if baseline[i] else 0)]
            pts += led.points[i][baseline[i]:]
            curve["tensors"] = downsample([(t - t0, b) for t, b in pts], CURVE_POINTS)
            f.update(source="tensors", allocated_bytes=led.totals[i], peak_allocated_bytes=led.peaks[i],
                     tensors_peak_bytes=led.peaks[i], breakdown=dict(led.peak_kinds[i]))
        if p.cuda_index is not None:
            a = cuda_allocator(p.cuda_index)
            f.update(source="cuda", allocated_bytes=a["allocated"], reserved_bytes=a["reserved"],
                     peak_allocated_bytes=a["peak"])
            if p.name in self._held_start:  # the library's floor and the training's peak (issue 31)
                held, training = self._held_start[p.name]
                f.update(step_memory_parts(held, a["peak"], training))
        if "source" not in f:  # no ledger, no CUDA: the process is all there is
            f.update(source="process", allocated_bytes=last.get("process"),
                     peak_allocated_bytes=max((b for _, b in curve.get("process", [])), default=None))
        f["curve"] = {src: downsample(pts, CURVE_POINTS) for src, pts in curve.items()}
        spans = (self.phases_of(self.devices.index(p)) if self.phases_of
                 else after_step(step_phases(self._last_fields, wall_ts(t0)), t1 - t0))
        f["phases"] = [[name, round(a - (t0 if self.phases_of else 0.0), 6),
                        round(b - (t0 if self.phases_of else 0.0), 6)] for name, a, b in spans]
        f["sampler"] = dict(interval_s=self.interval_s, readings=p.window_count,
                            window_s=window_s,
                            window_peak_bytes=dict(p.window_peak))
        return f


def step_phases(fields: dict[str, Any], origin_ts: float) -> list[tuple[str, float, float]]:
    """Forward, backward and optimizer of one step, in seconds from `origin_ts` (unix s), placed
    from the `step` event's measured durations: forward ends where backward starts
    (`backward_start_ts`), backward lasts `backward_s + comm_exposed_s`, the optimizer ends the step."""
    if not fields.get("start_ts"):
        return []
    at = fields["start_ts"] - origin_ts
    bwd = fields.get("backward_start_ts", fields["start_ts"] + fields.get("forward_s", 0.0)) - origin_ts
    end = at + fields.get("step_time_s", 0.0)
    return [("forward", bwd - fields.get("forward_s", 0.0), bwd),
            ("backward", bwd, bwd + fields.get("backward_s", 0.0) + (fields.get("comm_exposed_s") or 0.0)),
            ("optimizer", end - fields.get("optimizer_s", 0.0), end)]


def after_step(spans: list[tuple[str, float, float]], window_s: float) -> list[tuple[str, float, float]]:
    """`spans` (seconds from the traced window's start) and, where the window runs on past their
    last end, `AFTER_STEP_PHASE` from there to `window_s`: the instrument's own work after the step
    (a sampled step's profiler read, the ledger's close), which the curve covers and would
    otherwise show as the step's time (on a 300-step run's last step, 64 of 92 ms here)."""
    end = max((b for _, _, b in spans), default=None)
    if end is None or window_s - end <= MIN_AFTER_STEP_S:
        return spans
    return [*spans, (AFTER_STEP_PHASE, end, window_s)]


def downsample(points: list, max_points: int) -> list[list[float]]:
    """At most `max_points` of `(t_s, bytes)` points in time order: the first and last, and the
    lowest and highest of each time bin in between, so every rise, fall and the peak survive."""
    pts = [[round(float(t), 6), int(b)] for t, b in points]
    if len(pts) <= max_points:
        return pts
    bins = max(1, (max_points - 2) // 2)
    t_lo, t_hi = pts[0][0], pts[-1][0]
    width = (t_hi - t_lo) / bins or 1.0
    chosen: dict[int, tuple[int, int]] = {}
    for k, (t, b) in enumerate(pts[1:-1], start=1):
        j = min(bins - 1, int((t - t_lo) / width))
        lo, hi = chosen.get(j, (k, k))
        chosen[j] = (lo if pts[lo][1] <= b else k, hi if pts[hi][1] >= b else k)
    keep = sorted({0, len(pts) - 1} | {k for pair in chosen.values() for k in pair})
    return [pts[k] for k in keep]


@contextlib.contextmanager
def phase_hooks(ledger: TensorLedger, model: torch.nn.Module, opt: torch.optim.Optimizer | None,
                first_kind: str | None = "inputs") -> Iterator[None]:
    """Name what a single-device step creates (DDP ranks, single): "inputs" until the forward
    starts, "activations" in it, "loss" after it, "backward" in backward (autograd's own state),
    "grads" once a gradient lands in `.grad`, "optimizer" in `opt.step`. Installed only for a
    traced step and removed after it. `opt=None` (an attached script's optimizer, not known ahead)
    leaves "optimizer" to the caller; `first_kind` is what the step's first tensors are called."""
    ledger.set_kind(first_kind)
    handles = [model.register_forward_pre_hook(lambda m, a: ledger.set_kind(None)),
               model.register_forward_hook(lambda m, a, o: ledger.set_kind("loss"))]
    if opt is not None:
        handles.append(opt.register_step_pre_hook(lambda o, a, k: ledger.set_kind("optimizer")))
    handles += [p.register_post_accumulate_grad_hook(lambda p: ledger.retag([p.grad], "grads"))
                for p in model.parameters() if p.requires_grad]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        ledger.set_kind(None)


def model_memory_sampler(cfg: RunConfig, tel: Telemetry, model: nn.Module, opt: torch.optim.Optimizer,
                   device: torch.device, extra_existing=None) -> MemorySampler:
    """The memory sampler of one model on one device (`mode=single`, and each DDP rank): the ledger
    counts this process's tensors on `device`; the timer adds process RSS (and, on CUDA, the
    allocator and NVML). `extra_existing()` adds more ``(0, kind, tensors or held bytes)`` alive at a step's start."""
    ledger = TensorLedger(1, device_type=device.type)

    def existing():
        out = [(0, "params", model.parameters()), (0, "buffers", model.buffers()),
               (0, "grads", [p.grad for p in model.parameters()]),
               (0, "optimizer_state", optimizer_state_tensors(opt))]
        return out + list(extra_existing() if extra_existing else [])

    probe = DeviceProbe(tel.device, ledger_index=0,
                        cuda_index=(device.index or 0) if device.type == "cuda" else None)
    return MemorySampler(tel, [probe], cfg.steps, ledger=ledger, existing=existing,
                         hooks=lambda: phase_hooks(ledger, model, opt))
