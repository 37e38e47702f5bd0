"""The launched no-hook path of DDP (issue 31, `bucket_timing="recorder"`): no Python comm hook, so
training must be plain DDP's exactly, and the bucket events must be PyTorch's own layout with nothing
claimed that was not measured; a launched NCCL rank leaves the flight recorder off.

Independent reference: plain PyTorch DDP on 2 gloo ranks (`plain_ddp`: its final parameters and its
own `_get_ddp_logging_data()` bucket sizes). The readers themselves: tests/engine/test_reducer_stamps.py
(DDP's reducer, the profiler's sampled spans) and tests/engine/test_flight_recorder.py (the recorder).
"""

from __future__ import annotations

import pytest
import runs
import torch
from plain_ddp import plain_ddp

from ddpviz.engine.config import RunConfig
from ddpviz.engine.measure.memory_sampler import should_trace_memory
from ddpviz.engine.modes.ddp.reducer import READY_EXPOSED_SOURCE, READY_SOURCE
from ddpviz.engine.modes.ddp.rank import NO_BUCKET_TIMES, exposed_comm
from ddpviz.engine.modes.ddp.sampled import PROFILER_SOURCE
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


def test_exposed_comm_is_not_measured_without_ready_times():
    assert exposed_comm([dict(ready_s=None, comm_start_s=None)], 0.010, cuda=False) == (
        None, dict(comm_exposed_measured=False, comm_exposed_note=NO_BUCKET_TIMES))
    launched = [dict(ready_s=None, enqueue_s=0.001), dict(ready_s=None, enqueue_s=0.004)]  # CUDA, no hook
    assert exposed_comm(launched, 0.010, cuda=True) == (None, dict(comm_exposed_measured=False))
    hook = [dict(ready_s=0.002, comm_start_s=0.002), dict(ready_s=0.007, comm_start_s=0.007)]
    assert exposed_comm(hook, 0.010, cuda=True)[0] == pytest.approx(0.003)


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
