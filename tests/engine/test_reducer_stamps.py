"""DDP's reducer's own stamps (`Reducer::get_backward_stats`, `engine.modes.ddp.reducer.LayoutBuckets`):
ready times on CPU, host launch times on CUDA (issue 31), and the profiler's full spans on gloo's sampled
steps (`engine.modes.ddp.sampled`).

Independent references: a sleep in the backward between two buckets, PyTorch's post-accumulate-grad hooks,
PyTorch's flight recorder on gloo (`time_created_ns`) and the profiler's own `prof.events()`.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from ddpviz.engine.modes.ddp.reducer import ENQUEUE_SOURCE, READY_SOURCE, launches
from ddpviz.engine.modes.ddp.sampled import pair_spans
from tests.engine.field_models import SleepInBackward


def test_launches_are_the_running_latest_ready_time():
    """DDP launches bucket k once it and every bucket before it are ready (`Reducer::mark_bucket_ready`)."""
    assert launches([0.002, 0.001, 0.005, 0.004]) == [0.002, 0.002, 0.005, 0.005]
    assert launches([]) == []


ENQUEUE_VS_RECORDER = r"""
import json, os, sys, time
os.environ["TORCH_FR_BUFFER_SIZE"] = "64"  # before the process group: torch reads it then
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from ddpviz.engine.modes.ddp.flight import FlightReader
from ddpviz.engine.modes.ddp.reducer import LayoutBuckets
from ddpviz.engine.modes.launcher import free_port

class Sleep(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(0.03)
        return grad

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)

    def forward(self, x):
        return self.second(Sleep.apply(self.first(x)))

dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
torch.manual_seed(0)
ddp = DDP(Net(), bucket_cap_mb=0.01)  # one bucket per layer
log = LayoutBuckets(ddp, {p.data_ptr(): n for n, p in ddp.module.named_parameters()}, host_enqueue=True)
reader = FlightReader(backend="gloo")
x, out = torch.randn(8, 64), []
for step in range(4):
    loss = ddp(x)
    log.forward_returned()
    loss = loss.square().mean()
    log.begin_backward()
    origin_unix_ns = time.time_ns()
    loss.backward()
    rows = log.resolved()
    created = [(e["time_created_ns"] - origin_unix_ns) / 1e9 for e in reader.read()
               if str(e.get("profiling_name", "")).endswith("all_reduce")]
    out.append(dict(rows=rows, created=created))
dist.destroy_process_group()
print(json.dumps(out), flush=True)
os._exit(0)  # no interpreter teardown: PyTorch can abort there (tests/workers/attach_tools.py TEARDOWN_ABORT)
"""


def test_cuda_launch_times_are_the_enqueue_times_pytorchs_flight_recorder_gives(tmp_path):
    """On CUDA the no-hook path reports the reducer's stamps as launch times (`enqueue_s`), the host
    enqueue NCCL's flight recorder stamps as `time_created_ns`, without its dump. CPU twin, with the
    independent reference this machine has: the same labelling (`host_enqueue=True`) on a 1-rank gloo
    DDP with PyTorch's flight recorder on, whose entries carry `time_created_ns` (torch 2.13); two
    buckets, a 30 ms sleep in the backward between them. Each bucket's `enqueue_s` must be its own
    all-reduce's creation: the gap between the two within 2 ms of the recorder's (each side on its own
    clock: perf_counter and the wall clock), each within 15 ms of it (half the buckets' separation, so a
    bucket paired with the other's all-reduce fails; seen within 0.1 ms in 8 runs beside 2 busy loops),
    with no span and no ready time claimed."""
    import json
    import subprocess
    import sys

    script = tmp_path / "enqueue.py"
    script.write_text(ENQUEUE_VS_RECORDER)
    got = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr[-2000:]
    steps = json.loads(got.stdout.strip().splitlines()[-1])
    for step in steps[2:]:  # DDP's layout is rebuilt in the second forward
        rows, created = step["rows"], step["created"]
        assert len(created) == len(rows) == 2, step
        assert [r["source"] for r in rows] == [ENQUEUE_SOURCE] * 2
        assert all(r["ready_s"] is None and r["comm_start_s"] is None and r["comm_end_s"] is None for r in rows)
        assert [r["enqueue_s"] for r in rows] == pytest.approx(created, abs=0.015), step
        assert rows[1]["enqueue_s"] - rows[0]["enqueue_s"] == pytest.approx(created[1] - created[0], abs=0.002)
        assert rows[1]["enqueue_s"] - rows[0]["enqueue_s"] >= 0.03


def test_gloo_ready_times_come_from_ddps_reducer_on_every_step():
    """With no hook and no profiler (an ordinary step on gloo), each bucket's `ready_s` is DDP's
    reducer's own stamp of its last gradient. Independent references: a 30 ms sleep in the backward
    between the two layers (the first layer's bucket must be ready >= 30 ms after the second's), and
    PyTorch's post-accumulate-grad hooks timed by this test on the same parameters."""
    import time

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddpviz.engine.modes.ddp.reducer import LayoutBuckets
    from ddpviz.engine.modes.launcher import free_port
    from ddpviz.engine.modes.ranks import leave_process_group

    if dist.is_initialized():
        pytest.skip("a process group exists already")
    torch.manual_seed(0)
    first, second = torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)  # 16,640 B each

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.first, self.second = first, second

        def forward(self, x):
            return self.second(SleepInBackward.apply(self.first(x), 0.03))

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        ddp = DDP(Net(), bucket_cap_mb=0.01)  # one bucket per layer
        names = {p.data_ptr(): n for n, p in ddp.module.named_parameters()}
        log = LayoutBuckets(ddp, names)
        stamped: dict[str, float] = {}
        for n, p in ddp.module.named_parameters():
            p.register_post_accumulate_grad_hook(lambda p, n=n: stamped.__setitem__(n, time.perf_counter_ns()))
        x = torch.randn(8, 64)
        for step in range(4):
            out = ddp(x)
            log.forward_returned()
            loss = out.square().mean()
            log.begin_backward()
            origin = log._origin_ns
            loss.backward()
            got = log.resolved()
            if step < 2:
                continue  # DDP's layout is rebuilt in the second forward
            assert [b["source"] for b in got] == [READY_SOURCE] * 2
            layers = [params[0].split(".")[0] for params, _ in log._layout]  # DDP's rebuilt bucket order
            assert layers == ["second", "first"]
            ready = {layer: b["ready_s"] for layer, b in zip(layers, got)}
            assert ready["first"] - ready["second"] >= 0.03, (step, ready)
            for layer in ("first", "second"):
                hooked = max(stamped[f"{layer}.weight"], stamped[f"{layer}.bias"])
                assert abs(ready[layer] - (hooked - origin) / 1e9) < 0.002, (step, layer)
            assert all(b["comm_start_s"] is None and b["comm_end_s"] is None and not b["sampled"] for b in got)
    finally:
        leave_process_group()


@contextlib.contextmanager
def one_rank_group():
    """A one-process gloo group for the test's DDP (seeded), left after it; skips where one exists."""
    import torch.distributed as dist

    from ddpviz.engine.modes.launcher import free_port
    from ddpviz.engine.modes.ranks import leave_process_group

    if dist.is_initialized():
        pytest.skip("a process group exists already")
    torch.manual_seed(0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        yield
    finally:
        leave_process_group()


def test_static_graph_gets_ready_times_once_ddp_logs_its_layout():
    """With static_graph DDP logs its rebuilt layout's parameter indices only after the 4th backward (torch
    2.13); the layout was read on the first 3 only, so no later step had ready times (a new user's trial,
    2026-12-06). Reference: PyTorch's post-accumulate-grad hooks timed by this test on the same parameters."""
    import time

    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddpviz.engine.modes.ddp.reducer import LayoutBuckets, reducer_layout

    with one_rank_group():
        ddp = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)), bucket_cap_mb=0.01,
                  static_graph=True)
        log = LayoutBuckets(ddp, {p.data_ptr(): n for n, p in ddp.module.named_parameters()})
        stamped: dict[str, int] = {}
        for n, p in ddp.module.named_parameters():
            p.register_post_accumulate_grad_hook(lambda p, n=n: stamped.__setitem__(n, time.perf_counter_ns()))
        logged, timed = [], []
        for step in range(7):
            out = ddp(torch.randn(8, 64))
            log.forward_returned()
            log.begin_backward()
            origin = log._origin_ns
            out.square().mean().backward()
            got = log.resolved()
            logged.append(all(ix is not None for ix, _ in reducer_layout(ddp) or [(None, 0)]))
            if all(b["ready_s"] is not None for b in got):
                timed.append(step)
                for b in got:
                    layer = b.get("param_names", [None])[0] or log._layout[b["bucket_index"]][0][0]
                    prefix = layer.rsplit(".", 1)[0]
                    hooked = max(v for k, v in stamped.items() if k.startswith(prefix + "."))
                    assert abs(b["ready_s"] - (hooked - origin) / 1e9) < 0.002, (step, prefix)
    first = logged.index(True)  # DDP's own: the backward after which its rebuilt indices are logged
    assert first >= 3, logged
    assert timed == list(range(first, 7)), (logged, timed)


def test_a_sampled_step_whose_profile_stood_aside_is_no_steady_step(monkeypatch):
    """A sampled step on which ddpviz's profiler stood aside (here Kineto's on-demand daemon, `KINETO_USE_DAEMON`)
    is profiled by no one: its buckets' `source` says why (`resolved`). `steady_readies` gave that step's ready
    times as an ordinary step's, and an attached run wrote its buckets without the reason (a new user's trial,
    2026-12-07: a script profiler earlier in the run, steps ended by `ddpviz.step()` before the backward). Reference:
    `resolved()` of the same backward, which reads the reducer's stamps and names the reason."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddpviz.engine.modes.ddp.reducer import LayoutBuckets
    from ddpviz.engine.modes.ddp.sampled import ON_DEMAND

    with one_rank_group():
        ddp = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)), bucket_cap_mb=0.01)
        log = LayoutBuckets(ddp, {p.data_ptr(): n for n, p in ddp.module.named_parameters()})
        for step in range(5):
            out = ddp(torch.randn(8, 64))
            log.forward_returned()
            log.sample_next = sampled = step == 4
            if sampled:
                monkeypatch.setenv("KINETO_USE_DAEMON", "1")
            log.begin_backward()
            out.sum().backward()
            if step == 3:
                assert log.steady_readies() is not None, "an ordinary step before it"
                continue
            if sampled:
                assert log.sampler.stood_aside == ON_DEMAND and not log.sampler.active
                assert log.steady_readies() is None
            got = log.resolved()
    assert [b["source"].startswith(READY_SOURCE) for b in got] == [True, True]
    assert all(b["ready_s"] is not None and ON_DEMAND in b["source"] for b in got), got[0]["source"]


def test_a_sampled_step_whose_all_reduces_do_not_pair_says_why_and_claims_no_time():
    """Under find_unused_parameters DDP also all-reduces its map of used parameters: the profiled backward holds
    one all-reduce more than buckets, and the step's times were dropped without a word (a new user's trial,
    2026-12-06). Reference: the count of `gloo:all_reduce` in PyTorch's own event list of the same profile."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddpviz.engine.modes.ddp.reducer import LayoutBuckets
    from ddpviz.engine.modes.ddp.sampled import UNPAIRED

    with one_rank_group():
        ddp = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)), bucket_cap_mb=0.01,
                  find_unused_parameters=True)
        log = LayoutBuckets(ddp, {p.data_ptr(): n for n, p in ddp.module.named_parameters()})
        for step in range(3):
            out = ddp(torch.randn(8, 64))
            log.forward_returned()
            log.sample_next = step == 2
            log.begin_backward()
            prof = log.sampler._prof
            out.sum().backward()
            got = log.resolved()
    collectives = sum(1 for e in prof.events() if e.name == "gloo:all_reduce")
    assert collectives == len(got) + 1, (collectives, len(got))
    assert all(b["comm_start_s"] is None and not b["sampled"] for b in got)
    assert all(UNPAIRED.format(n=len(got)) in b["source"] for b in got), got[0]["source"]


def test_profiler_events_pair_launches_with_collectives():
    """The reducer's launch and the backend's implementation nest under one name (as seen on gloo,
    torch 2.13): the outer counts; gloo's workers run in launch order."""
    ev = [("ddpviz:backward", 100.0, 9000.0),
          ("c10d::allreduce_", 1100.0, 1300.0), ("c10d::allreduce_", 1150.0, 1250.0),
          ("c10d::allreduce_", 2100.0, 2300.0), ("c10d::allreduce_", 2120.0, 2200.0),
          ("gloo:all_reduce", 2400.0, 2600.0), ("gloo:all_reduce", 1400.0, 2000.0)]
    got = [x for span in pair_spans(ev) for x in span]
    assert got == pytest.approx([0.001, 0.0013, 0.0019, 0.002, 0.0023, 0.0025])
    assert pair_spans(ev[:-1]) is None  # a launch with no collective: nothing is claimed
    assert pair_spans(ev[1:]) is None  # no origin


def test_kineto_rows_read_the_same_spans_as_pytorchs_own_event_list():
    """`kineto_rows` reads the profiler's raw Kineto events (cheap); the reference is PyTorch's own
    `prof.events()` (FunctionEvents) of the same profiled backward: a 1-rank gloo DDP with two
    buckets, each bucket's ready, start and end within 1 us of the reference's."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.profiler import ProfilerActivity, profile, record_function

    from ddpviz.engine.modes.ddp.sampled import ORIGIN, kineto_rows
    from ddpviz.engine.modes.launcher import free_port
    from ddpviz.engine.modes.ranks import leave_process_group

    if dist.is_initialized():
        pytest.skip("a process group exists already")
    torch.manual_seed(0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        ddp = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)), bucket_cap_mb=0.01)
        for _ in range(2):  # the second backward runs on the rebuilt buckets
            loss = ddp(torch.randn(8, 64)).sum()
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                with record_function(ORIGIN):
                    loss.backward()
    finally:
        leave_process_group()
    mine = pair_spans(kineto_rows(prof))
    reference = pair_spans([(e.name, e.time_range.start, e.time_range.end) for e in prof.events()])
    assert reference is not None and len(reference) == 2
    assert [x for span in mine for x in span] == pytest.approx([x for span in reference for x in span], abs=1e-6)
