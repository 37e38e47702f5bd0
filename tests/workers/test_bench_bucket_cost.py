"""`ddpviz bench --bucket-cost` (issue 31): its record, with the harness replaced by stand-ins (no timing)."""

from __future__ import annotations

import pytest

import ddpviz.engine.harness.bucket_cost as harness
from ddpviz.workers.bench.bucket_cost import measure_bucket_cost


def test_the_record_has_each_bucket_timing_and_converts_to_microseconds(monkeypatch):
    seen = []

    def bucket_cost(cfg, caps, rounds, block_steps):
        seen.append((cfg.bucket_timing, caps, cfg.depth))
        return dict(per_bucket_s=0.0006 if cfg.bucket_timing == "hook" else 0.00001, per_bucket_interval_90=[0, 1])

    monkeypatch.setattr(harness, "bucket_cost", bucket_cost)
    monkeypatch.setattr(harness, "plain_alone", lambda cfg, rounds: dict(
        ratio=1.0, ratio_interval_90=[1, 1], mean_ratio=1.0, timing=cfg.bucket_timing, plain_vs_plain=1.1,
        plain_vs_plain_interval_90=[0.9, 1.2], between_steps_us=dict(plain=1.0, ddpviz=50.0), between_steps_share=0.03, between_steps_share_interval_90=[0.02, 0.04]))
    monkeypatch.setattr(harness, "in_thread_cost", lambda cfg, caps: dict(
        per_bucket_us=2.5, timing=cfg.bucket_timing, caps=[dict(cpu_us=40.0, buckets=1), dict(cpu_us=160.0, buckets=49)]))
    monkeypatch.setattr(harness, "direct_cost", lambda cfg, caps: dict(
        between_steps_us_per_bucket=1.5, background_us_per_bucket=2.0, timing=cfg.bucket_timing))
    out = measure_bucket_cost(rounds=2, say=lambda m: None)
    assert seen == [("hook", (25.0, 0.01), 48), ("recorder", (25.0, 0.01), 48)]
    assert out["timings"]["hook"]["per_bucket_us"] == pytest.approx(600.0)
    assert out["timings"]["recorder"]["per_bucket_us"] == pytest.approx(10.0)
    assert out["timings"]["recorder"]["per_step_alone"]["timing"] == "recorder"
    assert out["timings"]["recorder"]["in_thread"]["timing"] == "recorder" and "in_thread" not in out["timings"]["hook"]
    assert out["timings"]["recorder"]["direct"]["timing"] == "recorder" and "direct" not in out["timings"]["hook"]
    assert out["date"] and len(out["load_avg_start"]) == 3 and len(out["load_avg_end"]) == 3


def test_the_in_thread_figure_times_the_buckets_pytorch_makes():
    """`in_thread_cost` for real, briefly: its bucket counts are PyTorch's own (DDP's assignment
    rule, `bucket_count`: the independent reference), CPU time positive."""
    from ddpviz.engine.config import RunConfig

    cfg = RunConfig(mode="ddp", model="mlp", width=16, depth=6, global_batch_size=8, dataset="digits",
                    optimizer="sgd", device="cpu", bucket_timing="recorder")
    got = harness.in_thread_cost(cfg, (25.0, 0.0005), steps=12, warmup_steps=4)
    want = [harness.bucket_count(cfg.model_copy(update=dict(bucket_cap_mb=c, world_size=1))) for c in (25.0, 0.0005)]
    assert [r["buckets"] for r in got["caps"]] == want and want[0] == 1 < want[1]
    assert all(r["cpu_us"] > 0 and r["wall_us"] > 0 for r in got["caps"])


def test_the_small_step_figure_reads_a_typical_step_and_the_runs_pace():
    """Hand-worked: step starts 0, 1, 2, 4, 5, 6 s with the first left out: intervals 1, 2, 1, 1 s;
    median 1 s (a typical step), mean 1.25 s (the pace, the slow sampled step included)."""
    from ddpviz.engine.harness.bucket_cost import _step_intervals_s

    assert _step_intervals_s([0.0, 1.0, 2.0, 4.0, 5.0, 6.0], warmup_steps=1) == (1.0, 1.25)


def test_between_steps_is_the_median_gap_from_a_steps_end_to_the_next_start():
    """Hand-worked: starts 0, 10, 20, 30 s, ends 8, 19, 25, 38 s, the first step left out: gaps 20-19 = 1 and
    30-25 = 5 s (step 0's gap, 10-8, is warm-up); median 3 s. The last end has no next start."""
    from ddpviz.engine.harness.bucket_cost import between_steps_s

    assert between_steps_s([0.0, 10.0, 20.0, 30.0], [8.0, 19.0, 25.0, 38.0], warmup_steps=1) == 3.0


def test_the_direct_figure_is_the_slope_over_pytorchs_bucket_counts(monkeypatch):
    """Stand-in runs: 100 µs between steps and 60 µs of background at the 1-bucket cap, 400 and 300 at a cap
    PyTorch splits into n buckets (`bucket_count`, the real rule): slopes 300/(n-1) and 240/(n-1) µs a bucket."""
    from ddpviz.engine.config import RunConfig

    cfg = RunConfig(mode="ddp", model="mlp", width=16, depth=6, global_batch_size=8, dataset="digits",
                    optimizer="sgd", device="cpu", bucket_timing="recorder")
    fake = {25.0: (101.0, 60.0), 0.0005: (401.0, 300.0)}
    monkeypatch.setattr(harness, "plain_alone", lambda c, rounds, warmup_steps: dict(
        between_steps_us=dict(ddpviz=fake[c.bucket_cap_mb][0], plain=1.0),
        background_us_per_step=fake[c.bucket_cap_mb][1], ratio=1.0))
    got = harness.direct_cost(cfg, (25.0, 0.0005))
    n = harness.bucket_count(cfg.model_copy(update=dict(bucket_cap_mb=0.0005)))
    assert n > 1 and [c["buckets"] for c in got["caps"]] == [1, n]
    assert got["between_steps_us_per_bucket"] == pytest.approx(300.0 / (n - 1))
    assert got["background_us_per_bucket"] == pytest.approx(240.0 / (n - 1))


def test_a_run_between_two_plain_ones_cancels_a_linear_drift_by_hand():
    """Plain runs at 1.0 then 1.2 ms (the machine slowing steadily), ddpviz's between them at 1.1: the same
    speed, ratio 1.0, and the plain runs against each other 1.2 (the drift the harness sees)."""
    from ddpviz.engine.harness.bucket_cost import bracketed

    assert bracketed(1.0, 1.1, 1.2) == pytest.approx((1.0, 1.2))
    assert bracketed(2.0, 2.2, 2.0) == pytest.approx((1.1, 1.0))  # no drift: 10% slower
