"""Clocks that mark moments inside a step and turn two marks into seconds.

`HostClock` reads the host's monotonic clock (`time.perf_counter`): on CPU every collective and
kernel runs on the calling thread, so a host mark is when the work happened. `CudaClock` records a
CUDA event on the current stream: GPU work is queued, and only an event on the stream that runs it
says when it ran (`torch.cuda.Event.elapsed_time`, milliseconds, resolved after the events
complete). DDP's bucket recorder and FSDP's collective recorder take either.
"""

from __future__ import annotations

from typing import Any

import torch

from ddpviz.engine.measure.telemetry import now


class HostClock:
    """Wall-clock marks (perf_counter seconds)."""

    def mark(self) -> Any:
        return now()

    def seconds(self, origin: Any, mark: Any) -> float:
        return mark - origin

    def done(self, mark: Any) -> bool:
        """Whether `mark` can be read: a host mark at once."""
        return True


class CudaClock:
    """CUDA event marks, resolved to seconds after a synchronize.

    Args:
        device: the device whose current stream the events are recorded on — the module's (a DDP's
            `device_ids[0]` or its parameters' device), not the calling thread's current device:
            a script that never calls `torch.cuda.set_device` runs its main thread on GPU 0 while
            rank k's work runs on GPU k (issue 31.5); None: the current device (the old behaviour).
    """

    def __init__(self, device: torch.device | int | None = None):
        self.device = device

    def mark(self) -> Any:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(torch.cuda.current_stream(self.device))
        return ev

    def seconds(self, origin: Any, mark: Any) -> float:
        return origin.elapsed_time(mark) / 1e3

    def done(self, mark: Any) -> bool:
        """Whether the GPU has reached `mark` (`Event.query()`: never waits), so `seconds` may read it."""
        return bool(mark.query())


def wait_marks(marks: Any) -> None:
    """Wait until each mark can be read: a CUDA event (`CudaClock.mark`) until it completed
    (`torch.cuda.Event.synchronize`: that event only, not the whole device); host marks and None
    at once. For the end of a run, when nothing after the last step would read its marks."""
    for m in marks:
        if m is not None and hasattr(m, "synchronize"):
            m.synchronize()


class StepClock:
    """Marks inside one training step, read as seconds once the step's work has ended.

    On CPU a mark is the host clock (the work ran on the calling thread). On CUDA a mark is an event
    on the current stream, readable (`seconds`: `torch.cuda.Event.elapsed_time`) once it completed:
    after `settle()`, the step's one `torch.cuda.synchronize` (so a step costs one synchronize however
    many phases it times), or, with no synchronize at all, once `done(mark)` says so (a DDP rank reads
    its ordinary steps so, `engine.measure.deferred.DeferredSteps`).
    """

    def __init__(self, device: torch.device):
        self.device = device
        self._clock = CudaClock(device) if device.type == "cuda" else HostClock()

    def mark(self) -> Any:
        return self._clock.mark()

    def settle(self) -> None:
        """Wait for the step's queued work (CUDA); nothing to wait for on CPU."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def seconds(self, origin: Any, mark: Any) -> float:
        return self._clock.seconds(origin, mark)

    def done(self, mark: Any) -> bool:
        """Whether `mark` can be read without waiting (`HostClock.done`, `CudaClock.done`)."""
        return self._clock.done(mark)
