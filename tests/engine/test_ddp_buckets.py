"""Bucket events against PyTorch's own numbers: sizes, bytes per step, averaging, overlap — of the
Python comm hook path (`bucket_timing="hook"`: every span measured); the flight-recorder path, the
default, is tests/engine/test_ddp_flight.py."""

import pytest
from ddp_reference import reference_run

from ddpviz.engine.config import RunConfig
from ddpviz.engine.data import load_dataset
from ddpviz.engine.events import ListSink
from ddpviz.engine.models import build_model, grad_bytes
from ddpviz.engine.run import run_training

pytestmark = pytest.mark.slow
CFG = dict(model="mlp", width=64, depth=3, global_batch_size=32, steps=4, eval_every=0, lr=0.1, optimizer="sgd")


def buckets_by_step(sink, rank=0):
    out = {}
    for e in sink.of_type("bucket"):
        if e["rank"] == rank:
            out.setdefault(e["step"], []).append(e)
    return out


@pytest.fixture(scope="module")
def small_bucket_run():
    sink = ListSink()
    cfg = RunConfig(mode="ddp", bucket_cap_mb=0.005, bucket_timing="hook", **CFG)
    assert run_training(cfg, sink, "b").status == "succeeded"
    return cfg, sink


def test_bucket_bytes_add_up_to_the_gradient_every_step(small_bucket_run):
    cfg, sink = small_bucket_run
    expected = grad_bytes(build_model(cfg, load_dataset(cfg)))
    for rank in (0, 1):
        steps = buckets_by_step(sink, rank)
        assert sorted(steps) == list(range(cfg.steps))
        for step, bs in steps.items():
            assert sum(b["nbytes"] for b in bs) == expected, (rank, step)


def test_first_step_is_one_bucket_then_rebuilt_into_pytorchs_sizes(small_bucket_run):
    cfg, sink = small_bucket_run
    steps = buckets_by_step(sink)
    ref = reference_run(cfg, steps=3)  # plain PyTorch DDP, same model and cap
    assert [b["nbytes"] for b in steps[0]] == [int(s) for s in ref["bucket_sizes"].split(",")]
    rebuilt = [int(s) for s in ref["rebuilt"].split(",")]
    assert len(rebuilt) > 2
    for step in range(1, cfg.steps):
        assert [b["nbytes"] for b in steps[step]] == rebuilt
    # parameter names are reported when the layout first appears and after the rebuild
    assert all("param_names" in b for b in steps[0] + steps[1])
    assert not any("param_names" in b for b in steps[2])


def test_hook_keeps_ddp_averaging_semantics():
    ref = reference_run(RunConfig(bucket_cap_mb=0.005, **CFG), steps=3)
    assert ref["max_diff_vs_default_hook"] == 0.0  # bit-identical to PyTorch's allreduce_hook
    assert ref["max_diff_vs_single"] < 1e-6 * max(1.0, ref["grad_scale"])  # = the global mean gradient


def test_bucket_times_are_ordered_and_no_overlap_defers_every_all_reduce(small_bucket_run):
    _, sink = small_bucket_run
    for bs in buckets_by_step(sink).values():
        for b in bs:
            assert 0 <= b["ready_s"] <= b["comm_start_s"] <= b["comm_end_s"]
    off = ListSink()
    run_training(RunConfig(mode="ddp", bucket_cap_mb=0.005, overlap=False, **CFG), off, "c")
    for bs in buckets_by_step(off).values():
        last_ready = max(b["ready_s"] for b in bs)
        assert all(b["comm_start_s"] >= last_ready for b in bs)
    steps = [e for e in off.of_type("step") if e["rank"] == 0]
    assert all(e["comm_exposed_s"] > 0 for e in steps)
