"""The doctor's per-bucket cost arithmetic (issue 31.6) on hand-made figures: no timing involved."""

from __future__ import annotations

import pytest

from ddpviz.engine.config import RunConfig
from ddpviz.workers.doctor.cost import cost_rows, slope_us, verdict


def _measure(extra_per_bucket_s: float):
    counts = {25.0: 2, 1.0: 5, 0.1: 20}

    def measure(cfg):
        plain = 0.010
        return dict(plain_median_step_s=plain, ddpviz_median_step_s=plain + 0.001 + extra_per_bucket_s * counts[cfg.bucket_cap_mb],
                    ratio=1.0, ratio_interval_90=[1.0, 1.0], max_param_diff=0.0)
    return measure, lambda cfg: counts[cfg.bucket_cap_mb]


def test_per_bucket_cost_is_the_slope_so_per_step_costs_cancel():
    measure, count = _measure(20e-6)
    rows = cost_rows(measure, count, RunConfig(mode="ddp"))
    assert [r["buckets"] for r in rows] == [2, 5, 20]
    assert rows[0]["per_bucket_us"] is None
    assert [r["per_bucket_us"] for r in rows[1:]] == pytest.approx([20.0, 20.0])
    assert slope_us(rows) == pytest.approx(20.0)
    assert verdict(rows, gpu=False)[1] is True


def test_a_cost_above_the_target_is_reported_as_missed():
    measure, count = _measure(500e-6)
    rows = cost_rows(measure, count, RunConfig(mode="ddp"))
    text, ok = verdict(rows, gpu=False)
    assert not ok and "500 µs per bucket" in text
