"""The parts of `ddpviz doctor --gpu`'s probes and of the overhead measurement that run on CPU,
against hand-worked values and against each other (engine/gpu_checks.py, engine/overhead.py)."""

import pytest
import torch

from engine.config import RunConfig
from engine.gpu_checks import memory_imbalance, memory_sample_rates, shared_gpu_ddp
from engine.overhead import measure_overhead, step_stats


def test_memory_sample_rates_by_hand():
    # cuda:0: 5 samples over 0.4 s -> 4 intervals / 0.4 s = 10/s; cuda:1: one sample -> 0
    events = [{"type": "memory", "device": "cuda:0", "ts": 100.0 + 0.1 * i} for i in range(5)]
    events += [{"type": "memory", "device": "cuda:1", "ts": 100.2}, {"type": "step", "device": "cuda:1", "ts": 101}]
    rates = memory_sample_rates(events)
    assert rates["cuda:0"]["samples"] == 5 and rates["cuda:0"]["per_s"] == pytest.approx(10.0)
    assert rates["cuda:1"] == {"samples": 1, "span_s": 0.0, "per_s": 0.0}


def test_memory_imbalance_takes_each_devices_peak():
    events = [{"type": "memory", "device": "cuda:0", "peak_allocated_bytes": 300, "allocated_bytes": 100},
              {"type": "memory", "device": "cuda:0", "peak_allocated_bytes": 240},
              {"type": "memory", "device": "cuda:1", "allocated_bytes": 200}]
    out = memory_imbalance(events)
    assert out == {"peak_bytes": {"cuda:0": 300, "cuda:1": 200}, "max_over_min": 1.5}


def test_step_stats_by_hand():
    # intervals 1, 2, 1, 2, 1.5; the first dropped -> 2, 1, 2, 1.5: median 1.75, mean 1.625
    s = step_stats([0, 1, 3, 4, 6, 7.5], warmup=1)
    assert s == {"median_step_s": 1.75, "mean_step_s": 1.625, "steps": 4}
    with pytest.raises(ValueError, match="at least 2 steps after 4 warm-up"):
        step_stats([0, 1, 3, 4, 6, 7.5], warmup=4)


@pytest.mark.slow
def test_shared_device_ddp_harness_records_buckets_and_memory_per_rank():
    out = shared_gpu_ddp(world=2, steps=3, device_kind="cpu")
    assert [r["rank"] for r in out["ranks"]] == [0, 1] and not any("error" in r for r in out["ranks"])
    for r in out["ranks"]:
        assert len(r["steps"]) == 3
        last = r["steps"][-1]
        assert len(last["buckets"]) >= 2  # bucket_cap 0.25 MiB on a ~0.8 MiB GPT
        assert all(0 <= b["ready_s"] <= b["comm_start_s"] <= b["comm_end_s"] for b in last["buckets"])
        assert last["memory"]["allocated_bytes"] > 0
    sums = out["ranks"][0]["checksums"]
    assert sums[0] == sums[1]  # both ranks hold the same parameters after the all-reduced steps


@pytest.mark.slow
def test_overhead_compares_the_same_work_on_gloo():
    cfg = RunConfig(world_size=2, steps=6, global_batch_size=64, bucket_cap_mb=0.05)
    out = measure_overhead(cfg, rounds=1, warmup=2)
    assert out["backend"] == "gloo" and out["device_kind"] == "cpu"
    assert out["max_param_diff"] <= 1e-6  # plain and ddpviz DDP trained identically
    r = out["rounds"][0]
    assert r["plain"]["steps"] == r["ddpviz"]["steps"] == 4  # 6 step intervals, 2 dropped
    assert out["ratio"] == pytest.approx(out["ddpviz_median_step_s"] / out["plain_median_step_s"])
    with pytest.raises(ValueError, match="steps must be >= warmup"):
        measure_overhead(cfg.model_copy(update={"steps": 4}), rounds=1, warmup=2)
