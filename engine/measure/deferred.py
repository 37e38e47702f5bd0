"""Step figures read once the GPU has reached them, never by making the host wait (issue 31.2).

On CUDA a step's work is queued: its marks (`engine.measure.clocks.CudaClock` events) and its loss
are on the device when the host has finished issuing the step. Reading them at once needs a
synchronize (`Event.elapsed_time` on an incomplete event raises; `float(loss)` waits), which a plain
training loop does not do, and which stalls the host until the GPU has drained its queue: the next
step's kernels are then issued to an idle GPU. Here they are read later, when `Event.query()` says
they completed:

- `LossReading`: the loss copied, in float64, into pinned host memory by an asynchronous copy
  queued behind the step's work, read once an event recorded after the copy completed;
- `DeferredSteps`: a queue of ended steps, each with the mark that completes last and a function
  that reads its figures; `completed()` takes those whose mark completed, oldest first, at the end
  of a later step; `rest()` the others, polling, after the last step.

Host marks (floats, `HostClock`) and CPU tensors are complete at once, so on CPU both read at once.
Nothing here calls `torch.cuda.synchronize` or `Event.synchronize`; a CPU twin with stand-in events
(`tests/engine/test_deferred_steps.py`, `tests/engine/test_attach_loss_reading.py`) checks it.
"""

from __future__ import annotations

import os
import time
from collections import deque
from typing import Any, Callable, Iterable, Iterator

import torch

# "1": a CPU run reads its steps as a CUDA run does (`deferred_steps`; its marks host times, complete at once):
# the CPU twin of the CUDA path's plumbing, for the tests (tests/engine/test_deferred_steps.py)
DEFER_ON_CPU_ENV = "DDPVIZ_DEFER_CPU_STEPS"
DEFERRED_STEP_TIME = ("the step's first mark to its last: CUDA events on the device's stream, read once they completed "
                      "(no synchronize); host clock on CPU")  # the `step_time_source` of a step read late
LOSS_WAIT_S = 30.0  # at exit, how long a step's loss may take to reach the host (polled, never synchronize)
FAULT_WAIT_S = 5.0  # after a step failed, how long the steps before it may take to complete (their events still sent)
MAX_PENDING = 8  # ended steps not yet read; at more, the host waits (polling) for the oldest (see `add`)


class CudaOps:
    """The device calls `LossReading` makes on CUDA (a stand-in with the same methods runs its
    device path on CPU in tests: `tests/engine/test_attach_loss_reading.py`)."""

    @staticmethod
    def is_device(t: torch.Tensor) -> bool:
        return t.device.type == "cuda"

    @staticmethod
    def on(device: torch.device) -> Any:
        return torch.cuda.device(device)

    @staticmethod
    def pinned_empty(shape: torch.Size) -> torch.Tensor:
        return torch.empty(shape, dtype=torch.float64, pin_memory=True)

    @staticmethod
    def event() -> Any:
        return torch.cuda.Event()


class LossReading:
    """A step's loss on its way to the host, read without stalling the GPU.

    `values`: the scalar tensors backward() was called on (or the one given to `explicit_step`),
    or floats. The loss is their sum, in float64 on the host. CPU tensors and floats are read at
    once. Device tensors (`ops.is_device`, CUDA) are not: `float()` (as `.item()`) would
    synchronise the script's stream on every step; instead they are copied, in float64, into
    pinned host memory by an asynchronous copy queued behind the step's work, and read once an
    event recorded after the copy has completed (`ready`: `Event.query()`). Nothing here ever
    calls `Event.synchronize` (issue 31.2): `read` before `ready` returns None, and `wait` polls.
    """

    def __init__(self, values: list[Any], ops: Any = CudaOps):
        self.value: float | None = None
        self._host: torch.Tensor | None = None
        self._event: Any = None
        tensors = [v for v in values if isinstance(v, torch.Tensor)]
        device = tensors[0].device if tensors else None
        if device is not None and ops.is_device(tensors[0]) and len(tensors) == len(values) \
                and all(t.device == device for t in tensors):
            with ops.on(device):
                src = torch.stack([t.detach().reshape(()).to(torch.float64) for t in tensors])
                self._host = ops.pinned_empty(src.shape)
                self._host.copy_(src, non_blocking=True)
                self._event = ops.event()
                self._event.record()
        elif values:
            self.value = float(sum(float(v) for v in values))

    def ready(self) -> bool:
        return self._event is None or bool(self._event.query())

    def read(self) -> float | None:
        """The loss, or None while its copy has not completed (never waits)."""
        if self._event is not None:
            if not self._event.query():
                return None
            self.value, self._event = float(sum(self._host.tolist())), None
        return self.value

    def wait(self, timeout_s: float = LOSS_WAIT_S, poll_s: float = 0.001) -> float | None:
        """The loss, polling `ready` up to `timeout_s` (at exit, after the script's last step)."""
        deadline = time.monotonic() + timeout_s
        while not self.ready() and time.monotonic() < deadline:
            time.sleep(poll_s)
        return self.read()




def deferred_steps(device: torch.device) -> "DeferredSteps | None":
    """The queue a run on `device` reads its ordinary steps through: one on CUDA (or on CPU with
    `DEFER_ON_CPU_ENV`), else None (a CPU step's figures are host readings, complete when it ends)."""
    return DeferredSteps() if device.type == "cuda" or os.environ.get(DEFER_ON_CPU_ENV) == "1" else None


class StepLate(RuntimeError):
    """A step's figures did not reach the host in time (`DeferredSteps`: the GPU did not get to its
    last mark within the wait); `.step` is that step."""


class DeferredSteps:
    """Ended steps whose figures are read once the device reached them, in step order.

    Args:
        max_pending: ended steps left unread before `add` waits for the oldest. Waiting there never
            idles the GPU: it still has the newer steps queued; it only keeps the host from running
            further ahead than a plain loop's launch queue would let it (CUDA's, ~1,024 kernels).
        timeout_s: how long one step may take to complete once waited for (`StepLate` after it).
        poll_s: the sleep between two `ready()` checks while waiting.
    """

    def __init__(self, max_pending: int = MAX_PENDING, timeout_s: float = LOSS_WAIT_S, poll_s: float = 0.0005):
        self.max_pending, self.timeout_s, self.poll_s = max_pending, timeout_s, poll_s
        self.pending: deque[tuple[int, Callable[[], bool], Callable[[], dict]]] = deque()
        self._send: Callable[[Iterable[tuple[int, dict]]], None] | None = None

    def bind(self, send: Callable[[Iterable[tuple[int, dict]]], None]) -> None:
        """`send(ended)`: how the step loop sends ended steps' events (`engine.components.loop.drive` binds it),
        for `flush`."""
        self._send = send

    def flush(self) -> None:
        """Send every queued step now, in order, through the bound `send`: for a step that synchronised (all
        before it completed), before it computes anything that depends on the steps before it (a DDP rank's
        `comm_volume` compares a step's bucket sizes with the previous step's)."""
        if self.pending and self._send is not None:
            self._send(self.rest())

    def __len__(self) -> int:
        return len(self.pending)

    def add(self, step: int, ready: Callable[[], bool], read: Callable[[], dict]) -> None:
        """Queue step `step`: `ready()` says whether its figures can be read (its last mark and its
        `LossReading` completed: `Event.query()`, never a synchronize); `read()` reads them (the step
        event's fields) and is called once, after `ready()` was True."""
        self.pending.append((step, ready, read))
        if len(self.pending) > self.max_pending:
            self._wait(self.pending[0])

    def add_step(self, step: int, clock: Any, first: Any, last: Any, losses: list[Any],
                 fields: Callable[[float, float], dict]) -> None:
        """Queue a step timed by `clock`'s marks (a `StepClock`'s, or one wrapping it): `first` and `last`
        bound its work on the device, `losses` its loss tensors. It is read once `last` and the loss's copy
        completed, as `fields(step_time_s, loss)` (its time: `first` to `last`) with `step_time_source`."""
        reading = LossReading(losses)
        self.add(step, lambda: clock.done(last) and reading.ready(), lambda: {
            **fields(clock.seconds(first, last), reading.read()), "step_time_source": DEFERRED_STEP_TIME})

    def completed(self) -> list[tuple[int, dict]]:
        """(step, fields) of the oldest steps that completed, oldest first; stops at the first that has
        not (steps are read in order). Raises what a `read` raised, with `.step` set to its step."""
        out = []
        while self.pending and self.pending[0][1]():
            out.append(self._read(self.pending.popleft()))
        return out

    def rest(self, timeout_s: float | None = None) -> Iterator[tuple[int, dict]]:
        """(step, fields) of every queued step, oldest first, each once it completed, waiting (polling) up
        to `timeout_s` for each (default the queue's): after the last step, before an evaluation, after a
        failed step, or before a step whose figures are read at once (its synchronize completed the rest
        already). A generator: a caller that sends each as it comes has sent those before a late one.

        Raises:
            StepLate: a step did not complete in time.
        """
        while self.pending:
            self._wait(self.pending[0], timeout_s)
            yield self._read(self.pending.popleft())

    def _wait(self, item: tuple[int, Callable[[], bool], Callable[[], dict]], timeout_s: float | None = None) -> None:
        step, ready, _ = item
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        while not ready():
            if time.monotonic() > deadline:
                exc = StepLate(f"step {step}'s figures did not reach the host within {timeout_s:g} s "
                               f"(its work never completed on the device)")
                exc.step = step
                raise exc
            time.sleep(self.poll_s)

    @staticmethod
    def _read(item: tuple[int, Callable[[], bool], Callable[[], dict]]) -> tuple[int, dict]:
        step, _, read = item
        try:
            return step, read()
        except Exception as exc:
            if getattr(exc, "step", None) is None:
                exc.step = step
            raise

