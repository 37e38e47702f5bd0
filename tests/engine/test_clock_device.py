"""Timing events go on the module's device (issue 31.5), checked on CPU with stand-in CUDA events and
streams: a script that never calls `torch.cuda.set_device` has its main thread on GPU 0 while rank
k's DDP runs on GPU k, so an event on "the current stream" would land on GPU 0 (a context there
from every rank, and `elapsed_time` across devices fails)."""

from __future__ import annotations

import torch

from ddpviz.engine.measure.clocks import CudaClock, StepClock


class _Stream:
    def __init__(self, device):
        self.device = device


class _Event:
    made: list["_Event"] = []

    def __init__(self, enable_timing=False):
        self.stream = None
        _Event.made.append(self)

    def record(self, stream=None):
        self.stream = stream


def _stand_ins(monkeypatch):
    asked = []
    _Event.made = []

    def current_stream(device=None):
        asked.append(device)
        return _Stream(0 if device is None else torch.device(device).index)  # None: the thread's, GPU 0

    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(torch.cuda, "current_stream", current_stream)
    return asked


def test_cuda_marks_are_recorded_on_the_given_devices_stream(monkeypatch):
    asked = _stand_ins(monkeypatch)
    dev = torch.device("cuda", 1)
    CudaClock(dev).mark()
    StepClock(dev).mark()
    assert [e.stream.device for e in _Event.made] == [1, 1]
    assert asked == [dev, dev]


def test_launched_and_attached_recorders_build_their_clock_on_the_module_device():
    """The places that make a CudaClock pass the device they record for (a bare `CudaClock()` would
    record on the thread's current device)."""
    import inspect

    from ddpviz.engine.attach import ddp as attach_ddp, fsdp as attach_fsdp
    from ddpviz.engine.modes.ddp import rank as ddp_rank
    from ddpviz.engine.modes.fsdp import rank as fsdp_rank

    for mod in (attach_ddp, attach_fsdp, ddp_rank, fsdp_rank):
        src = inspect.getsource(mod)
        assert "CudaClock(" in src and "CudaClock()" not in src, mod.__name__
