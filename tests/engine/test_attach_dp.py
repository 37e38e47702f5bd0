"""nn.DataParallel in an attached run (engine/attach/dp.py), on CPU stand-ins for CUDA.

DataParallel keeps device ids only with GPUs; here a DataParallel is given two ids by hand and
torch.nn.parallel's CUDA-only copies are faked on CPU (tests/engine/dp_cpu_fakes.py: only the
copies; `replicate`'s wiring, autograd and the hooks are real), with host-clock marks. Checked
against independent references: the bytes DP must move (the model's parameter and buffer bytes,
the input's and output's chunk sizes), the phases of `DataParallel.forward` and of `Broadcast`'s
backward, and the same steps without ddpviz (parameters bitwise equal).
"""

from __future__ import annotations

import copy
import importlib

import pytest
import torch
import torch.nn as nn
import torch.nn.parallel._functions as functions
from dp_cpu_fakes import CpuBroadcast, broadcast_coalesced
from torch.nn.parallel import comm

from ddpviz.engine.attach.dp import CPU_NOTE, patch_data_parallel, watch_data_parallel
from ddpviz.engine.attach.env import RUN_ID_ENV, SPOOL_ENV
from ddpviz.engine.attach.session import Session
from ddpviz.engine.attach.steps import StepTracker
from ddpviz.engine.events import ListSink
from ddpviz.engine.modes.dp.hooks import HostClock

data_parallel = importlib.import_module("torch.nn.parallel.data_parallel")  # the attribute is a function
BATCH, FEATURES, STEPS = 8, 6, 3


def scatter_kwargs(inputs, kwargs, target_gpus, dim=0):
    n = len(target_gpus)
    chunks = [x.chunk(n, dim) for x in inputs]
    return (tuple(tuple(c[j] if j == 0 else c[j].clone() for c in chunks) for j in range(n)),
            tuple({} for _ in range(n)))


def parallel_apply(modules, inputs, kwargs, devices=None):
    return [m(*i, **k) for m, i, k in zip(modules, inputs, kwargs)]


def gather(outputs, target_device, dim=0):
    return torch.cat(outputs, dim)


@pytest.fixture
def cpu_dp(monkeypatch):
    for name in ("__init__", "scatter", "replicate", "parallel_apply", "gather"):  # undone after the test
        monkeypatch.setattr(nn.DataParallel, name, getattr(nn.DataParallel, name))
    monkeypatch.setattr(functions, "Broadcast", CpuBroadcast)
    monkeypatch.setattr(comm, "broadcast_coalesced", broadcast_coalesced)
    monkeypatch.setattr(data_parallel, "scatter_kwargs", scatter_kwargs)
    monkeypatch.setattr(data_parallel, "parallel_apply", parallel_apply)
    monkeypatch.setattr(data_parallel, "gather", gather)


def _two_device_dp(model: nn.Module) -> nn.DataParallel:
    dp = nn.DataParallel(model)  # on CPU: no device ids
    dp.device_ids, dp.output_device, dp.src_device_obj, dp.dim = [0, 1], 0, torch.device("cpu"), 0
    return dp


def _train(dp: nn.DataParallel, tracker: StepTracker | None) -> list[float]:
    opt = torch.optim.SGD(dp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(STEPS):
        x, y = torch.randn(BATCH, FEATURES, generator=g), torch.randn(BATCH, 1, generator=g)
        loss = nn.functional.mse_loss(dp(x), y)
        m = tracker.backward_start(loss) if tracker else None
        loss.backward()
        if tracker:
            tracker.backward_end(m)
            tracker.optimizer_start(opt)
        opt.step()
        if tracker:
            tracker.optimizer_end(opt)
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def test_dataparallel_phases_and_bytes_on_two_devices_leave_training_unchanged(cpu_dp, tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, 16), nn.BatchNorm1d(16), nn.Tanh(), nn.Linear(16, 1))
    plain_model = copy.deepcopy(model)
    plain_losses = _train(_two_device_dp(plain_model), None)

    sink = ListSink()
    s = Session({RUN_ID_ENV: "r", SPOOL_ENV: str(tmp_path)}, sink=sink)
    tracker = StepTracker(s)
    patch_data_parallel(s, tracker)
    dp = _two_device_dp(model)
    assert watch_data_parallel(s, tracker, dp, clock=HostClock) is not None
    losses = _train(dp, tracker)
    s.close()

    assert losses == plain_losses
    for a, b in zip(model.parameters(), plain_model.parameters()):
        assert torch.equal(a, b)
    events = sink.events
    assert [e["message"] for e in events if e["type"] == "log"] == [CPU_NOTE]  # nn.DataParallel() on CPU said so
    assert not s.disabled

    steps = [e for e in events if e["type"] == "step"]
    assert [e["step"] for e in steps] == list(range(STEPS))
    assert [e["loss"] for e in steps] == pytest.approx(losses, rel=1e-12)
    assert all(e["comm_exposed_measured"] and e["comm_exposed_s"] > 0 and e["samples"] == BATCH for e in steps)

    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    state_bytes = param_bytes + sum(b.numel() * b.element_size() for b in model.buffers())
    half = BATCH // 2
    for step in range(STEPS):
        phases = [e for e in events if e["type"] == "dp_phase" and e["step"] == step]
        by = {(e["phase"], e["device"]): e for e in phases}
        expected = {(p, d) for p in ("broadcast", "scatter", "forward", "gather", "backward", "reduce")
                    for d in ("cpu:0", "cpu:1")} | {("loss", "cpu:0")}
        assert set(by) == expected, step
        assert all(e["start_s"] <= e["end_s"] for e in phases)
        assert by[("broadcast", "cpu:1")]["nbytes"] == state_bytes  # a replica's parameters and buffers
        assert by[("scatter", "cpu:1")]["nbytes"] == half * FEATURES * 4
        assert by[("gather", "cpu:1")]["nbytes"] == half * 1 * 4
        assert by[("reduce", "cpu:1")]["nbytes"] == param_bytes  # replica 1's gradients
        volume = {e["device"]: e for e in events if e["type"] == "comm_volume" and e["step"] == step}
        # device 1 receives its replica, its input chunk and d loss/d output; sends its output and gradients
        assert volume["cpu:1"]["recv_bytes"] == state_bytes + half * FEATURES * 4 + half * 4
        assert volume["cpu:1"]["sent_bytes"] == half * 4 + param_bytes
        assert volume["cpu:0"]["sent_bytes"] == volume["cpu:1"]["recv_bytes"]  # the hub's side of a star
