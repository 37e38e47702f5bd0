"""`ddpviz run --bucket-timing recorder` without a GPU: the variables the launcher hands the ranks,
and the no-hook bucket records of `engine.attach.nohook` on a stand-in DDP, including its NCCL path
(a stand-in flight-recorder dump with `duration_ms`, which gloo never gives).

References: hand-made dumps and layouts (what PyTorch's recorder and DDP's reducer hand over,
engine/modes/ddp/flight.py), and `engine.config.BUCKET_TIMINGS`.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
from torch import nn

from ddpviz.engine.attach import nohook
from ddpviz.engine.attach.env import BUCKET_TIMING_ENV, bucket_timing, child_environment, set_bucket_timing
from ddpviz.engine.attach.nohook import (FLIGHT_MISSED_SOURCE, NOT_MEASURED_NOTE, SCRIPT_HOOK_SOURCE, NoHookBuckets,
                                         comm_exposed)
from ddpviz.engine.config import BUCKET_TIMINGS
from ddpviz.engine.modes.ddp.flight import FlightReader


def test_the_launcher_asks_for_the_recorder_and_its_variables_keeping_the_users():
    from ddpviz.workers.cli.command_env import command_env

    env = command_env("r1", Path("/tmp/spool"), ["torchrun", "train.py"], bucket_timing="recorder")
    assert env[BUCKET_TIMING_ENV] == "recorder" and bucket_timing(env) == "recorder"
    assert env["TORCH_FR_BUFFER_SIZE"] == "144" and env["TORCH_NCCL_ENABLE_TIMING"] == "1"  # 2 x 64 buckets + 16
    auto = command_env("r1", Path("/tmp/spool"), ["torchrun", "train.py"])  # the default
    assert auto[BUCKET_TIMING_ENV] == "auto" and bucket_timing(auto) == "auto"
    assert "TORCH_NCCL_ENABLE_TIMING" not in auto and "TORCH_FR_BUFFER_SIZE" not in auto  # NCCL: the hook
    hook = command_env("r1", Path("/tmp/spool"), ["torchrun", "train.py"], bucket_timing="hook")
    assert hook[BUCKET_TIMING_ENV] == "hook" and "TORCH_NCCL_ENABLE_TIMING" not in hook
    assert env["KINETO_LOG_LEVEL"] == "6" and "KINETO_LOG_LEVEL" not in hook  # the sampled steps' profiler, quiet
    assert auto["KINETO_LOG_LEVEL"] == "6"  # a gloo DDP's sampled steps profile
    mine = {"TORCH_FR_BUFFER_SIZE": "4000", "TORCH_NCCL_ENABLE_TIMING": "0", "KINETO_LOG_LEVEL": "2"}
    set_bucket_timing(mine, "recorder")
    assert mine["TORCH_FR_BUFFER_SIZE"] == "4000" and mine["TORCH_NCCL_ENABLE_TIMING"] == "0"
    assert mine["KINETO_LOG_LEVEL"] == "2"
    with pytest.raises(ValueError, match="bucket_timing must be one of auto, hook, recorder"):
        set_bucket_timing({}, "nccl")


def test_a_rank_reads_the_config_names_and_an_old_runs_variable_is_dropped():
    assert BUCKET_TIMINGS == ("hook", "recorder")
    assert bucket_timing({BUCKET_TIMING_ENV: "auto"}) == "auto"
    assert bucket_timing({}) == "hook" and bucket_timing({BUCKET_TIMING_ENV: "bogus"}) == "hook"
    assert BUCKET_TIMING_ENV not in child_environment({BUCKET_TIMING_ENV: "recorder"}, "r2", Path("/tmp/s"))


class _Bucket:
    def __init__(self, params):
        self._params = params

    def parameters(self):
        return self._params

    def buffer(self):
        return torch.zeros(sum(p.numel() for p in self._params))


class _StandInDDP:
    """What `NoHookBuckets` reads of a DDP: its module, process group, reducer layout, logging data."""

    def __init__(self):
        self.module = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))  # 15 + 8 parameters
        self.process_group = object()
        ps = list(self.module.parameters())
        self.reducer = type("R", (), {"_get_zeros_like_grad_buckets": lambda _: [_Bucket(ps[2:]), _Bucket(ps[:2])]})()

    def _get_ddp_logging_data(self):
        return dict(rebuilt_bucket_sizes="32, 60", rebuilt_per_bucket_param_indices="2 3,0 1")


def _entry(rid, created_ns, numel, duration_ms=None):
    e = dict(record_id=rid, profiling_name="nccl:all_reduce", time_created_ns=created_ns, input_sizes=[[numel]],
             input_dtypes=["Float"])
    return e if duration_ms is None else dict(e, duration_ms=duration_ms)


def _nccl(monkeypatch, entries):
    monkeypatch.setattr(nohook.dist, "get_backend", lambda group: "nccl")
    monkeypatch.setattr("time.time_ns", lambda: 1_000_000_000)
    ddp = _StandInDDP()
    names = {p.data_ptr(): n for n, p in ddp.module.named_parameters()}
    return NoHookBuckets(ddp, names, flight=FlightReader(lambda **kw: pickle.dumps({"entries": entries})))


def test_nccl_buckets_take_enqueue_times_and_gpu_durations_from_the_recorder_but_no_span(monkeypatch):
    b = _nccl(monkeypatch, [_entry(1, 999_000_000, 60, 0.5),  # before the backward: the last step's
                            _entry(2, 1_001_000_000, 8, 0.25), _entry(3, 1_003_000_000, 15)])  # the last still running
    assert not b.sampling  # the profiler's spans are gloo's
    b.begin_backward(sample=True)
    out = b.resolved()
    assert [r["nbytes"] for r in out] == [32, 60] and [r["num_params"] for r in out] == [2, 2]
    assert [r["enqueue_s"] for r in out] == pytest.approx([0.001, 0.003])
    assert out[0]["comm_duration_s"] == pytest.approx(0.00025) and out[1]["comm_duration_s"] is None
    assert out[0]["param_names"] == ["1.weight", "1.bias"] and "GPU duration" in out[0]["source"]
    assert all(r["ready_s"] is None and r["comm_start_s"] is None and r["comm_end_s"] is None for r in out)
    assert all(r["sampled"] is True and "no comm hook" in r["nbytes_source"] for r in out)


def test_nccl_reads_the_recorder_on_sampled_steps_only(monkeypatch):
    """A dump costs per entry held (issue 31: 166 entries 4.8 ms on an H200 host): an unsampled
    step reads none and claims no time."""
    b = _nccl(monkeypatch, [_entry(1, 1_001_000_000, 8, 0.25), _entry(2, 1_003_000_000, 15, 0.5)])
    dumps = []
    dump = b.flight.reader.dump
    b.flight.reader.dump = lambda **kw: dumps.append(1) or dump(**kw)
    b.begin_backward(sample=False)
    out = b.resolved()
    assert dumps == [] and [r["nbytes"] for r in out] == [32, 60]
    assert all(r["comm_start_s"] is None and r["comm_end_s"] is None and r["sampled"] is False for r in out)
    b.begin_backward(sample=True)
    assert [r["enqueue_s"] for r in b.resolved()] == pytest.approx([0.001, 0.003]) and dumps == [1]


def test_a_step_the_recorder_did_not_hold_whole_gets_the_layout_and_claims_no_time(monkeypatch):
    b = _nccl(monkeypatch, [_entry(1, 1_002_000_000, 15, 0.5)])  # one all-reduce held for two buckets
    b.begin_backward(sample=True)
    out = b.resolved()
    assert [r["nbytes"] for r in out] == [32, 60]
    assert all(r["comm_start_s"] is None and r["comm_end_s"] is None for r in out)
    assert out[0]["source"] == FLIGHT_MISSED_SOURCE.format(got=1, want=2)


def test_a_scripts_own_hook_leaves_every_time_unclaimed(monkeypatch):
    b = _nccl(monkeypatch, [_entry(1, 1_001_000_000, 8, 0.25), _entry(2, 1_003_000_000, 15, 0.5)])
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    b.note_script_hook(default_hooks.fp16_compress_hook)
    b.begin_backward(sample=True)
    out = b.resolved()
    assert [r["nbytes"] for r in out] == [32, 60]
    assert all(r["source"] == SCRIPT_HOOK_SOURCE and r["comm_start_s"] is None and r["comm_end_s"] is None
               and r["comm_hook"] == "fp16_compress_hook" and "before the script's comm hook" in r["nbytes_source"]
               for r in out)


def test_exposed_comm_is_measured_only_when_every_bucket_has_its_ready_time():
    timed = [dict(ready_s=0.002), dict(ready_s=0.007)]
    assert comm_exposed(timed, 0.010) == (pytest.approx(0.003), dict(comm_exposed_measured=True))
    assert comm_exposed([dict(ready_s=0.002), dict(ready_s=None)], 0.010) == (
        0.0, dict(comm_exposed_measured=False, comm_exposed_note=NOT_MEASURED_NOTE))
    assert comm_exposed([], 0.010)[1]["comm_exposed_measured"] is False


def _cuda_layout(monkeypatch, stats):
    """`LayoutBuckets` of a stand-in CUDA DDP whose reducer stamps `stats` (ns from its forward's end), or
    none at all (`stats` None: a torch without `get_backward_stats`)."""
    from ddpviz.engine.modes.ddp.reducer import LayoutBuckets

    ddp = _StandInDDP()
    ddp.device = torch.device("cuda")  # a device object only: nothing runs on it
    if stats is not None:
        ddp.reducer.get_backward_stats = lambda: stats
    clock = iter([5_000, 6_000])  # the forward's end, then the backward's start (ns)
    monkeypatch.setattr("time.perf_counter_ns", lambda: next(clock))
    log = LayoutBuckets(ddp, {p.data_ptr(): n for n, p in ddp.module.named_parameters()})
    log.forward_returned()
    log.begin_backward()
    return log.resolved()


def test_a_cuda_ddps_stamps_are_its_buckets_launches_in_index_order(monkeypatch):
    """Hand-worked: bucket 0 holds parameters 2 and 3, bucket 1 parameters 0 and 1 (the stand-in's rebuilt
    layout). Bucket 1's own last stamp (1,500 ns after the forward) is before bucket 0's (4,000): DDP
    launches it only after bucket 0, so both launch at 4,000 ns - 1,000 ns (the backward began 1,000 ns
    after the forward's end). No ready time or span is claimed on CUDA."""
    from ddpviz.engine.modes.ddp.reducer import ENQUEUE_SOURCE

    rows = _cuda_layout(monkeypatch, [1_000, 1_500, 3_000, 4_000])
    assert [r["enqueue_s"] for r in rows] == pytest.approx([3e-6, 3e-6])
    assert all(r["source"] == ENQUEUE_SOURCE and r["ready_s"] is None and r["comm_start_s"] is None
               and r["comm_end_s"] is None for r in rows)


def test_a_torch_without_the_reducers_stamps_gets_the_layout_and_no_error(monkeypatch):
    rows = _cuda_layout(monkeypatch, None)
    assert [r["nbytes"] for r in rows] == [32, 60]
    assert all("enqueue_s" not in r and r["ready_s"] is None and r["comm_start_s"] is None for r in rows)


def test_auto_is_the_recorder_for_a_gloo_ddp_and_the_hook_for_nccl_or_sparse_gradients(monkeypatch):
    """`ddpviz run`'s default (`auto`) resolved per DDP as a launched run's is (`effective_bucket_timing`), and a
    model with sparse gradients keeps the hook whatever was asked (the reducer's layout gives dense sizes)."""
    from types import SimpleNamespace

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddpviz.engine.attach.nohook import bucket_timing_of
    from ddpviz.engine.components.ports import free_port

    def asked(timing):
        return SimpleNamespace(bucket_timing=timing)

    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        dense, sparse = DDP(nn.Linear(4, 4)), DDP(nn.Sequential(nn.Embedding(8, 4, sparse=True), nn.Linear(4, 1)))
        assert bucket_timing_of(asked("auto"), dense, cpu) == "recorder"
        assert bucket_timing_of(asked("hook"), dense, cpu) == "hook"
        assert bucket_timing_of(asked("recorder"), dense, cpu) == "recorder"
        assert bucket_timing_of(asked("auto"), sparse, cpu) == "hook"
        assert bucket_timing_of(asked("recorder"), sparse, cpu) == "hook"
        unused = DDP(nn.Linear(4, 4), find_unused_parameters=True)
        assert bucket_timing_of(asked("auto"), unused, cpu) == "hook"
        assert bucket_timing_of(asked("recorder"), unused, cpu) == "recorder"  # asked for: kept
        monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
        assert bucket_timing_of(asked("auto"), dense, cuda) == "hook"
        assert bucket_timing_of(asked("recorder"), dense, cuda) == "recorder"
        monkeypatch.setattr(dist, "get_backend", lambda group=None: "cpu:gloo,cuda:nccl")  # init_process_group()
        assert bucket_timing_of(asked("auto"), dense, cpu) == "recorder"
        assert bucket_timing_of(asked("auto"), dense, cuda) == "hook"
    finally:
        monkeypatch.undo()
        dist.destroy_process_group()


def test_a_sampled_steps_profile_ends_with_its_step_when_a_part_raised_before_reading_it(tmp_path):
    """The recorder profiles sampled steps (0-2) and stops the profile when the step's buckets are read; a part that
    raised before that read (here the step event) left PyTorch's profiler running, and the script died of SIGSEGV
    at its exit (`ddpviz run`'s default on gloo, 2026-12-06)."""
    from attach_process import EPILOGUE, PREAMBLE, run_script

    script = 'import os\nos.environ["DDPVIZ_ATTACH_BUCKET_TIMING"] = "auto"\n' + PREAMBLE + r'''
import ddpviz.engine.attach.steps as steps
emit = steps.StepTracker._emit_step
def broken(self, end):
    if self.step == 1:
        raise RuntimeError("sabotaged step event")
    return emit(self, end)
steps.StepTracker._emit_step = broken
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(4):
    model(torch.randn(4, 8)).sum().backward()
    during = torch._C._autograd._profiler_enabled()
    opt.step()
    opt.zero_grad()
    print("profiling", i, during, torch._C._autograd._profiler_enabled(), flush=True)
''' + EPILOGUE
    lines = run_script(tmp_path, script, "attached", ("profiling",))
    # steps 0-2 are profiled through their backward (the reference: the profiler is on there); none after its step
    assert lines == ["profiling 0 True False", "profiling 1 True False", "profiling 2 False False",
                     "profiling 3 False False"], lines
