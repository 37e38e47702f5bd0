"""The no-hook path of DDP (issue 31, `bucket_timing="recorder"`): no Python comm
hook, so training must be plain DDP's exactly, and the bucket events must be PyTorch's own layout
with nothing claimed that the recorder did not measure.

Independent references: plain PyTorch DDP on 2 gloo ranks (`plain_ddp`: its final parameters and
its own `_get_ddp_logging_data()` bucket sizes), and hand-made recorder dumps (the NCCL case, with
`duration_ms`, which this CPU machine cannot produce).
"""

from __future__ import annotations

import pickle

import pytest
import runs
import torch
from plain_ddp import plain_ddp

from ddpviz.engine.config import RunConfig
from ddpviz.engine.modes.ddp.flight import (ENQUEUE_SOURCE, READY_EXPOSED_SOURCE, READY_SOURCE, FlightBuckets,
                                            FlightReader, buffer_entries, enable_recorder, launches, recorder_on)
from ddpviz.engine.measure.memory_sampler import should_trace_memory
from ddpviz.engine.modes.ddp.rank import NO_BUCKET_TIMES, exposed_comm
from ddpviz.engine.modes.ddp.sampled import PROFILER_SOURCE, pair_spans
from ddpviz.engine.summary import OVERLAP_NOT_MEASURED

CFG = dict(mode="ddp", world_size=2, model="mlp", width=64, depth=3, global_batch_size=32, steps=5,
           eval_every=0, lr=0.1, optimizer="sgd", step_delay_s=0.0, probe=False, bucket_cap_mb=0.005,
           bucket_timing="recorder")


@pytest.fixture(scope="module")
def recorded():
    cfg = RunConfig(**CFG)
    result, sink = runs.train(cfg, "flight")
    return cfg, result, sink, plain_ddp(cfg)


@pytest.mark.slow
def test_recorder_path_trains_exactly_like_plain_ddp(recorded):
    _, result, _, ref = recorded
    assert ref["in_sync"]
    torch.testing.assert_close(result.final_params, ref["params"], rtol=0, atol=0)  # the same C++ path


@pytest.mark.slow
def test_every_steps_buckets_are_pytorchs_layout_with_full_spans_on_sampled_steps_only(recorded):
    cfg, result, sink, ref = recorded
    initial = [int(s) for s in ref["logging"]["bucket_sizes"].split(",")]
    rebuilt = [int(s) for s in ref["logging"]["rebuilt_bucket_sizes"].split(",")]
    counts = [len(g.split()) for g in ref["logging"]["rebuilt_per_bucket_param_indices"].split(",")]
    assert len(rebuilt) == 3 and len(initial) == 1
    for rank in (0, 1):
        by_step = {}
        for e in sink.of_type("bucket"):
            if e["rank"] == rank:
                by_step.setdefault(e["step"], []).append(e)
        assert sorted(by_step) == list(range(cfg.steps))
        for step, bs in by_step.items():
            assert [b["bucket_index"] for b in bs] == list(range(len(bs)))
            assert [b["nbytes"] for b in bs] == (initial if step == 0 else rebuilt), (rank, step)
            if step:
                assert [b["num_params"] for b in bs] == counts
            sampled = should_trace_memory(step, cfg.steps)  # steps 0-2 and the last; step 3 is not
            for b in bs:
                if sampled:  # the profiler's spans, in order, launched in index order
                    assert 0 < b["ready_s"] <= b["comm_start_s"] < b["comm_end_s"], (rank, step)
                    assert b["sampled"] is True and b["source"] == PROFILER_SOURCE
                else:  # gloo, no hook, no recorder: ready from DDP's reducer, all-reduce times null
                    assert b["ready_s"] > 0 and b["comm_start_s"] is None and b["comm_end_s"] is None
                    assert b["sampled"] is False and b["source"] == READY_SOURCE
            if sampled:
                readies = [b["ready_s"] for b in bs]
                assert readies == sorted(readies)
        assert all("param_names" in b for b in by_step[0] + by_step[1])
        assert not any("param_names" in b for b in by_step[2])
    step_ev = {e["step"]: e for e in sink.of_type("step") if e["rank"] == 0}
    assert 0 <= step_ev[3]["comm_exposed_s"] <= step_ev[3]["step_time_s"]  # the reducer's ready times
    assert step_ev[3]["comm_exposed_source"] == READY_EXPOSED_SOURCE and "comm_exposed_measured" not in step_ev[3]
    assert all(step_ev[s]["comm_exposed_s"] >= 0 for s in (0, 1, 2, 4))  # measured on sampled steps
    # 4 of 5 steps sampled: the summary keeps them (instrument steps are dropped only while half remain),
    # but step 3's all-reduce was not timed: no overlap figure for steps it never saw, and the note says why
    assert result.summary["overlap"] is None and result.summary["overlap_note"] == OVERLAP_NOT_MEASURED
    assert "comm_exposed_note" not in result.summary


@pytest.mark.slow
def test_no_overlap_still_runs_the_python_hook_and_says_so():
    _, sink = runs.train(RunConfig(**{**CFG, "overlap": False, "steps": 2}), "nooverlap")
    bs = sink.of_type("bucket")
    assert bs and all(b["source"].startswith("comm hook (Python)") and b["comm_end_s"] is not None for b in bs)


def _dump(entries):
    return lambda **kw: pickle.dumps({"version": "2.x", "entries": entries})


def _entry(rid, created_ns, numel, duration_ms=None, name="nccl:all_reduce"):
    e = dict(record_id=rid, profiling_name=name, time_created_ns=created_ns, input_sizes=[[numel]],
             input_dtypes=["Float"])
    if duration_ms is not None:
        e["duration_ms"] = duration_ms
    return e


def test_nccl_entries_give_enqueue_times_and_gpu_durations_but_no_span(monkeypatch):
    """A stand-in NCCL dump: `time_created_ns` -> enqueue_s, `duration_ms` -> comm_duration_s, and no
    span made of the two (the GPU starts later than the host enqueues); entries created before the
    backward (a broadcast, the last step's buckets) and other collectives are not buckets."""
    monkeypatch.setattr("time.time_ns", lambda: 1_000_000_000)
    fb = FlightBuckets(FlightReader(lambda **kw: b""), lambda: [((3, 2), 400), ((1, 0), 800)], ["a", "b", "c", "d"])
    fb.begin_backward()
    fb.reader.dump = _dump([_entry(1, 999_000_000, 100, 0.5), _entry(2, 1_002_000_000, 100, 0.25),
                            _entry(3, 1_003_000_000, 7, name="nccl:all_gather"), _entry(4, 1_004_000_000, 200, 1.0)])
    out = fb.resolved()
    assert [b["nbytes"] for b in out] == [400, 800]
    assert [b["enqueue_s"] for b in out] == pytest.approx([0.002, 0.004])
    assert [b["comm_duration_s"] for b in out] == pytest.approx([0.00025, 0.001])
    assert all(b[k] is None for b in out for k in ("ready_s", "comm_start_s", "comm_end_s"))
    assert [b["param_names"] for b in out] == [["d", "c"], ["b", "a"]] and out[1]["is_last"]
    assert "GPU duration" in out[0]["source"] and "start and end not measured" in out[0]["source"]


def test_a_backward_taken_and_read_after_the_next_began_gets_its_own_entries_and_later_durations(monkeypatch):
    """A CUDA rank reads a step late (`FlightBuckets.taken`): by then the next backward has begun and its
    all-reduces are in the recorder too. Each backward gets the entries created from its start to the next
    one's; the recorder is read when the step is, so a duration NCCL's watchdog set after the step ended
    is there."""
    clock = iter([1_000_000_000, 2_000_000_000])
    monkeypatch.setattr("time.time_ns", lambda: next(clock))
    fb = FlightBuckets(FlightReader(_dump([])), lambda: [((0,), 400), ((1,), 800)], ["a", "b"])
    fb.begin_backward()  # step 0's backward, at 1 s
    first = fb.taken()
    fb.begin_backward()  # step 1's, at 2 s
    second = fb.taken()
    fb.reader.dump = _dump([_entry(1, 1_001_000_000, 100, 0.5), _entry(2, 1_002_000_000, 200, 0.25),
                            _entry(3, 1_500_000_000, 4, name="gloo:all_gather"),  # the replica check: no bucket
                            _entry(4, 2_001_000_000, 100, 0.75), _entry(5, 2_003_000_000, 200)])
    one = first()
    assert [b["enqueue_s"] for b in one] == pytest.approx([0.001, 0.002])
    assert [b["comm_duration_s"] for b in one] == pytest.approx([0.0005, 0.00025])
    fb.reader.dump = _dump([_entry(5, 2_003_000_000, 200, 2.0)])  # the same entry, retired since: a duration
    two = second()
    assert [b["nbytes"] for b in two] == [400, 800]
    assert [b["enqueue_s"] for b in two] == pytest.approx([0.001, 0.003])
    assert two[0]["comm_duration_s"] == pytest.approx(0.00075) and two[1]["comm_duration_s"] is None  # step 0's read
    assert "not measured" in two[1]["source"]


def test_a_layout_that_does_not_match_the_entries_gives_no_parameter_counts():
    fb = FlightBuckets(FlightReader(_dump([_entry(1, 10**19, 100)])), lambda: [((0,), 999)], ["a"])
    fb.begin_backward()
    fb.origin_ns = 0
    (b,) = fb.resolved()
    assert b["nbytes"] == 400 and b["num_params"] is None and "param_names" not in b


def test_exposed_comm_is_not_measured_without_ready_times():
    assert exposed_comm([dict(ready_s=None, comm_start_s=None)], 0.010, cuda=False) == (
        None, dict(comm_exposed_measured=False, comm_exposed_note=NO_BUCKET_TIMES))
    launched = [dict(ready_s=None, enqueue_s=0.001), dict(ready_s=None, enqueue_s=0.004)]  # CUDA, no hook
    assert exposed_comm(launched, 0.010, cuda=True) == (None, dict(comm_exposed_measured=False))
    hook = [dict(ready_s=0.002, comm_start_s=0.002), dict(ready_s=0.007, comm_start_s=0.007)]
    assert exposed_comm(hook, 0.010, cuda=True)[0] == pytest.approx(0.003)


def test_enable_recorder_sizes_the_buffer_and_keeps_a_users_choice():
    env: dict[str, str] = {}
    assert enable_recorder(buffer_entries(10), "nccl", env) == 36
    assert env["TORCH_FR_BUFFER_SIZE"] == "36" and env["TORCH_NCCL_ENABLE_TIMING"] == "1"
    mine = {"TORCH_FR_BUFFER_SIZE": "2000"}
    assert enable_recorder(36, "gloo", mine) == 2000 and "TORCH_NCCL_ENABLE_TIMING" not in mine


def test_the_recorder_is_on_only_with_a_buffer():
    assert recorder_on({"TORCH_FR_BUFFER_SIZE": "36"}) and recorder_on({"TORCH_NCCL_TRACE_BUFFER_SIZE": "8"})
    assert not recorder_on({}) and not recorder_on({"TORCH_FR_BUFFER_SIZE": "0"})


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


class _GroupMade(Exception):
    pass


def test_a_launched_nccl_rank_leaves_the_flight_recorder_off(monkeypatch):
    """The recorder path reads DDP's reducer on every backend: a launched NCCL rank must not turn the
    flight recorder on (a dump per step cost 0.55-1.6 ms on an H100 host). CPU twin: a stand-in dump
    exists, so the old path would have set the buffer before the process group; it is not made."""
    import os

    from ddpviz.engine.modes.ddp import flight, rank

    for k in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_ENABLE_TIMING"):
        monkeypatch.setenv(k, "")  # recorded, so whatever the rank sets is undone after the test
        monkeypatch.delenv(k)
    monkeypatch.setattr(flight, "dump_function", lambda backend="gloo": (lambda **kw: b""))
    seen = {}

    def init_rank(cfg, backend, device_kind):
        seen.update({k: os.environ.get(k) for k in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_ENABLE_TIMING")})
        raise _GroupMade

    monkeypatch.setattr(rank, "init_rank", init_rank)
    cfg = RunConfig(mode="ddp", world_size=2, width=16, depth=2, bucket_timing="recorder", steps=3)
    with pytest.raises(_GroupMade):
        rank._train_rank(cfg, "r", 0, None, "nccl", "cpu", None, "")
    assert seen == {"TORCH_FR_BUFFER_SIZE": None, "TORCH_NCCL_ENABLE_TIMING": None}


def test_launches_are_the_running_latest_ready_time():
    """DDP launches bucket k once it and every bucket before it are ready (`Reducer::mark_bucket_ready`)."""
    assert launches([0.002, 0.001, 0.005, 0.004]) == [0.002, 0.002, 0.005, 0.005]
    assert launches([]) == []


ENQUEUE_VS_RECORDER = r"""
import json, os, sys, time
os.environ["TORCH_FR_BUFFER_SIZE"] = "64"  # before the process group: torch reads it then
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from ddpviz.engine.modes.ddp.flight import FlightReader, LayoutBuckets
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


class _SleepInBackward(torch.autograd.Function):
    """Identity forward; its backward sleeps, so the layers before it get their gradients late."""

    @staticmethod
    def forward(ctx, x, seconds):
        ctx.seconds = seconds
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        import time

        time.sleep(ctx.seconds)
        return grad, None


def test_gloo_ready_times_come_from_ddps_reducer_on_every_step():
    """With no hook and no profiler (an ordinary step on gloo), each bucket's `ready_s` is DDP's
    reducer's own stamp of its last gradient. Independent references: a 30 ms sleep in the backward
    between the two layers (the first layer's bucket must be ready >= 30 ms after the second's), and
    PyTorch's post-accumulate-grad hooks timed by this test on the same parameters."""
    import time

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddpviz.engine.modes.ddp.flight import LayoutBuckets
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
            return self.second(_SleepInBackward.apply(self.first(x), 0.03))

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


def test_nccl_reads_the_recorder_that_holds_nccls_collectives(monkeypatch):
    """NCCL's entries are in a flight recorder of their own (`_dump_nccl_trace`); `_dump_fr_trace` dumps the
    generic one, which holds gloo's: on the H100 (torch 2.11) the latter returned no entry after 1,024 NCCL
    all-reduces. Stand-ins for both dumps, each saying which it is."""
    import torch._C._distributed_c10d as c10d

    from ddpviz.engine.modes.ddp.flight import dump_function

    def nccl(**kw):
        return pickle.dumps({"entries": [dict(record_id=0, profiling_name="nccl:all_reduce", time_created_ns=5)]})

    def generic(**kw):
        return pickle.dumps({"entries": []})

    monkeypatch.setattr(c10d, "_dump_nccl_trace", nccl, raising=False)
    monkeypatch.setattr(c10d, "_dump_fr_trace", generic, raising=False)
    assert dump_function("nccl") is nccl and dump_function("gloo") is generic
    assert [e["profiling_name"] for e in FlightReader(backend="nccl").read()] == ["nccl:all_reduce"]
    assert FlightReader(backend="gloo").read() == []
    monkeypatch.delattr(c10d, "_dump_nccl_trace")  # a build without NCCL: the generic dump is all there is
    assert dump_function("nccl") is generic


def test_flight_cost_reads_back_every_entry_it_made_on_gloo():
    """`engine.harness.flight_cost` on this machine's backend: the recorder it reads must hold the all-reduces it
    issued (on the H100 the wrong dump gave 0 of 1,024), each read timed."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:  # its own process: the recorder's buffer is read when the process group is made
        got = pool.apply(_flight_cost_small)
    assert got["backend"] == "gloo"
    assert [(r["held"], r["entries"]) for r in got["rows"]] == [(4, 4), (12, 12)]
    assert all(r["dump_ms"] > 0 and r["us_per_entry"] > 0 for r in got["rows"])
    assert "time_created_ns" in got["entry_keys"] and got["duration_ms_present"] is False  # gloo: no GPU time


def _flight_cost_small():
    from ddpviz.engine.harness.flight_cost import flight_cost

    return flight_cost((4, 12))
