"""The attached run's loss on CUDA reaches the host without a synchronize (issue 31.2): the CUDA
path of `engine.attach.steps.LossReading` run on CPU with stand-in device calls whose events
count `synchronize` (and fail if it is called) and complete only when the test says so."""

from __future__ import annotations

import pytest
import torch

from ddpviz.engine.attach.steps import LossReading, StepTracker


class StandInEvent:
    """A CUDA event stand-in: `query()` is False until `done`; `synchronize` fails the test."""

    made: list["StandInEvent"] = []

    def __init__(self):
        self.recorded = self.done = False
        self.queries = 0
        StandInEvent.made.append(self)

    def record(self) -> None:
        self.recorded = True

    def query(self) -> bool:
        self.queries += 1
        return self.done

    def synchronize(self) -> None:
        raise AssertionError("LossReading called Event.synchronize")


class StandInOps:
    """`engine.attach.steps.CudaOps` on CPU: every tensor is 'on the device'."""

    copies: list[torch.Tensor] = []

    @staticmethod
    def is_device(t: torch.Tensor) -> bool:
        return True

    @staticmethod
    def on(device):
        import contextlib

        return contextlib.nullcontext()

    @staticmethod
    def pinned_empty(shape):
        out = torch.full(shape, float("nan"), dtype=torch.float64)
        StandInOps.copies.append(out)
        return out

    @staticmethod
    def event():
        return StandInEvent()


@pytest.fixture(autouse=True)
def fresh():
    StandInEvent.made.clear()
    StandInOps.copies.clear()


def test_the_device_path_is_taken_and_read_only_once_its_event_completed():
    losses = [torch.tensor(1.25), torch.tensor(0.5, dtype=torch.float16)]
    r = LossReading(losses, ops=StandInOps)
    assert len(StandInEvent.made) == 1 and StandInEvent.made[0].recorded  # the device path, not float()
    assert r.value is None and len(StandInOps.copies) == 1
    assert not r.ready() and r.read() is None  # not completed: no value, no wait
    StandInEvent.made[0].done = True
    assert r.ready() and r.read() == 1.75  # Σ in float64 on the host, as float(1.25) + float(0.5)


def test_wait_at_exit_polls_and_never_synchronizes():
    r = LossReading([torch.tensor(3.0)], ops=StandInOps)
    ev = StandInEvent.made[0]
    assert r.wait(timeout_s=0.05, poll_s=0.01) is None and ev.queries >= 2  # polled, gave up, no synchronize
    ev.done = True
    assert r.wait(timeout_s=0.05) == 3.0


class _Session:
    rank, world_size, disabled = 0, 1, set()

    def __init__(self):
        self.emitted: list[dict] = []

    def emit(self, type_, **fields):
        self.emitted.append(dict(type=type_, **fields))

    def guard(self, part, fn, *a, **k):
        return fn(*a, **k)


def test_the_tracker_sends_steps_in_order_once_their_loss_arrived(monkeypatch):
    import ddpviz.engine.attach.steps as steps

    monkeypatch.setattr(steps.LossReading.__init__, "__defaults__", (StandInOps,))
    s = _Session()
    tracker = StepTracker(s)
    for value in (2.0, 4.0):
        m = tracker.backward_start(torch.tensor(value))
        tracker.backward_end(m)
        tracker.optimizer_start()
        tracker.optimizer_end()
    assert [e for e in s.emitted if e["type"] == "step"] == []  # both losses still 'on the device'
    StandInEvent.made[1].done = True
    tracker.send_steps()
    assert [e for e in s.emitted if e["type"] == "step"] == []  # step 1's came first: steps go out in order
    StandInEvent.made[0].done = True
    tracker.send_steps()
    assert [(e["step"], e["loss"]) for e in s.emitted if e["type"] == "step"] == [(0, 2.0), (1, 4.0)]
