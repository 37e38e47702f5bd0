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
    monkeypatch.setattr(harness, "plain_alone", lambda cfg, rounds: dict(ratio=1.0, ratio_interval_90=[1, 1],
                                                                         timing=cfg.bucket_timing))
    out = measure_bucket_cost(rounds=2, say=lambda m: None)
    assert seen == [("hook", (25.0, 0.01), 48), ("recorder", (25.0, 0.01), 48)]
    assert out["timings"]["hook"]["per_bucket_us"] == pytest.approx(600.0)
    assert out["timings"]["recorder"]["per_bucket_us"] == pytest.approx(10.0)
    assert out["timings"]["recorder"]["per_step_alone"]["timing"] == "recorder"
    assert out["date"] and len(out["load_avg_start"]) == 3 and len(out["load_avg_end"]) == 3
