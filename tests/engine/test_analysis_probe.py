"""Buckets that ran alone, the relative-error ring fit and its range, in-run vs probe busbw.

References are worked by hand in each test (interval overlaps, weighted sums, log2
interpolation); the synthetic probe is built from a known α and β with seeded noise.
"""

import math
import random

import pytest

from ddpviz.engine.analysis import (
    busbw_vs_probe,
    fit_ring_range,
    fit_ring_times,
    mark_alone,
    median_busbw_ratio,
    probe_busbw_at,
    probe_fit,
    probe_point,
    ring_factor,
)
from ddpviz.engine.modes.ddp.probe import probe_sizes


def _b(step, rank, idx, start, end, nbytes=1000):
    return {"type": "bucket", "step": step, "rank": rank, "bucket_index": idx, "nbytes": nbytes,
            "comm_start_s": start, "comm_end_s": end}


def test_mark_alone_on_hand_worked_intervals():
    evs = [
        _b(1, 0, 0, 0.0, 2.0),   # A overlaps B (1..2 shared)
        _b(1, 0, 1, 1.0, 3.0),   # B overlaps A
        _b(1, 0, 2, 3.0, 4.0),   # C only touches B at 3.0: one after the other -> alone
        _b(1, 0, 3, 5.0, 6.0),   # D alone
        _b(1, 1, 0, 0.0, 2.0),   # E: rank 1, same times as A, but another rank -> alone
        _b(2, 0, 0, 1.5, 2.5),   # F: step 2 -> alone
        _b(3, 0, 0, 10.0, 20.0),  # G contains H -> both overlapped
        _b(3, 0, 1, 12.0, 13.0),  # H
        {**_b(3, 0, 2, 12.5, None)},  # no end: left out
    ]
    out = mark_alone(evs)
    assert [(e["step"], e["rank"], e["bucket_index"], e["alone"]) for e in out] == [
        (1, 0, 0, False), (1, 0, 1, False), (1, 0, 2, True), (1, 0, 3, True), (1, 1, 0, True),
        (2, 0, 0, True), (3, 0, 0, False), (3, 0, 1, False)]


def test_probe_point_busbw_by_hand():
    p = probe_point(1_048_576, 0.002, world_size=4)
    assert p["algbw_bytes_per_s"] == pytest.approx(524_288_000.0)  # 1048576 / 0.002
    assert p["busbw_bytes_per_s"] == pytest.approx(786_432_000.0)  # × 2·3/4 = 1.5
    assert probe_point(4096, 0.001, 2)["busbw_bytes_per_s"] == pytest.approx(4_096_000.0)  # × 1
    assert probe_point(8192, 0.001, 8)["busbw_bytes_per_s"] == pytest.approx(8_192_000 * 1.75)


def test_probe_sizes_and_refusals():
    assert probe_sizes() == [4096 * 2 ** i for i in range(15)]  # 4 KiB .. 64 MiB
    assert probe_sizes(4096, 65536, 4) == [4096, 16384, 65536]
    for kwargs, field in (({"min_bytes": 6}, "min_bytes"), ({"max_bytes": 10}, "max_bytes"),
                          ({"factor": 1}, "factor")):
        with pytest.raises(ValueError, match=field):
            probe_sizes(**kwargs)


def test_relative_fit_with_constraints_by_hand():
    # t = 2x − 1 has a < 0: the fit is the best line through the origin,
    # c = Σ x/t / Σ x²/t² = (1 + 2/3 + 3/5) / (1 + 4/9 + 9/25).
    fit = fit_ring_times([(1, 1.0), (2, 3.0), (3, 5.0)], world_size=2)
    assert fit["latency_s"] == 0.0
    assert fit["s_per_byte"] == pytest.approx((1 + 2 / 3 + 3 / 5) / (1 + 4 / 9 + 9 / 25))
    # falling times: c would be < 0, so c = 0 and a = Σ 1/t / Σ 1/t².
    fit = fit_ring_times([(1, 4.0), (2, 2.0)], world_size=2)
    assert fit["s_per_byte"] == 0.0 and fit["beta_bytes_per_s"] == math.inf
    assert fit["latency_s"] == pytest.approx((1 / 4 + 1 / 2) / (1 / 16 + 1 / 4))
    assert fit_ring_times([(5, 1.0), (5, 2.0)], world_size=2) is None  # one size: undetermined


def _synthetic(alpha, beta, n, sizes, noise, seed=0, slow_above=None):
    rng = random.Random(seed)
    pts = []
    for b in sizes:
        t = 2 * (n - 1) * alpha + ring_factor(n) * b / beta
        if slow_above and b > slow_above:
            t *= 2.5  # another regime (caches): the line must not be forced through it
        pts.append(probe_point(b, t * (1 + rng.uniform(-noise, noise)), n))
    return pts


@pytest.mark.parametrize("n,seed", [(2, 0), (4, 1), (8, 2)])
def test_probe_fit_recovers_known_alpha_beta_with_noise(n, seed):
    alpha, beta = 50e-6, 2e9  # 50 µs per hop, 2 GB/s
    fit = probe_fit(_synthetic(alpha, beta, n, probe_sizes(), noise=0.08, seed=seed), n)
    assert fit["alpha_s"] == pytest.approx(alpha, rel=0.2)
    assert fit["beta_bytes_per_s"] == pytest.approx(beta, rel=0.2)
    assert fit["points_used"] == probe_sizes() and fit["within_tolerance"]


def test_probe_fit_leaves_out_a_slower_regime_and_says_so():
    n, alpha, beta = 2, 100e-6, 1e9
    pts = _synthetic(alpha, beta, n, probe_sizes(), noise=0.05, slow_above=2 * 2 ** 20)
    fit = probe_fit(pts, n)
    assert fit["points_used"] == [b for b in probe_sizes() if b <= 2 * 2 ** 20]
    assert fit["alpha_s"] == pytest.approx(alpha, rel=0.2)
    assert fit["beta_bytes_per_s"] == pytest.approx(beta, rel=0.2)
    assert fit["max_rel_residual"] <= fit["tolerance"]


def test_relative_weighting_is_what_recovers_the_latency():
    """The premise of the weighting, over 20 noisy probes: plain least squares misses α by more
    than half in some of them (the largest sizes' noise sets the intercept); the fit never by
    more than 20%."""
    n, alpha, beta = 2, 50e-6, 2e9
    plain_err, fit_err = [], []
    for seed in range(20):
        pts = _synthetic(alpha, beta, n, probe_sizes(), noise=0.08, seed=seed)
        xs, ts = [p["nbytes"] for p in pts], [p["time_s"] for p in pts]
        mx, mt = sum(xs) / len(xs), sum(ts) / len(ts)
        c = sum((x - mx) * (t - mt) for x, t in zip(xs, ts)) / sum((x - mx) ** 2 for x in xs)
        plain_err.append(abs((mt - c * mx) / (2 * (n - 1)) / alpha - 1))
        fit_err.append(abs(probe_fit(pts, n)["alpha_s"] / alpha - 1))
    assert max(plain_err) > 0.5
    assert max(fit_err) < 0.2


def test_fit_range_widest_then_largest():
    # sizes 1..6, a line t = 1 + x for 1..3 and a line t = 10x for 4..6: two 3-size ranges,
    # neither extends to a fourth size within 20%; ties go to the larger sizes.
    pts = [(1, 2.0), (2, 3.0), (3, 4.0), (4, 40.0), (5, 50.0), (6, 60.0)]
    fit = fit_ring_range(pts, world_size=2)
    assert fit["points_used"] == [4, 5, 6] and fit["within_tolerance"]
    fit = fit_ring_range(pts[:5], world_size=2)  # 4..5 is only two sizes: 1..3 wins
    assert fit["points_used"] == [1, 2, 3]
    wild = [(1, 1.0), (2, 9.0), (3, 1.0), (4, 9.0)]  # no three sizes on a line
    fit = fit_ring_range(wild, world_size=2)
    assert fit["points_used"] == [1, 2, 3, 4] and not fit["within_tolerance"]


def test_probe_interpolated_in_log_size_and_ratio_by_hand():
    probe = [{"nbytes": 4096, "busbw_bytes_per_s": 1e8}, {"nbytes": 16384, "busbw_bytes_per_s": 3e8}]
    assert probe_busbw_at(probe, 8192) == pytest.approx(2e8)  # log2 midpoint of 4096 and 16384
    assert probe_busbw_at(probe, 4096) == pytest.approx(1e8)
    assert probe_busbw_at(probe, 2048) is None and probe_busbw_at(probe, 32768) is None
    buckets = [_b(1, 0, 0, 0.0, 8192 / 1e8, nbytes=8192),  # alone: busbw 1e8 (n = 2) -> 0.5
               _b(1, 0, 1, 1.0, 1.0 + 8192 / 4e7, nbytes=8192),  # overlaps the next: 0.2
               _b(1, 0, 2, 1.0001, 1.1, nbytes=8192),
               _b(2, 0, 0, 0.0, 0.001, nbytes=65536)]  # outside the probe: no ratio
    rows = busbw_vs_probe(buckets, probe, world_size=2)
    assert [r["alone"] for r in rows] == [True, False, False, True]
    assert rows[0]["ratio"] == pytest.approx(0.5) and rows[1]["ratio"] == pytest.approx(0.2)
    assert rows[3]["ratio"] is None and rows[3]["probe_busbw_bytes_per_s"] is None
    assert median_busbw_ratio(rows) == pytest.approx(0.5)  # alone only
    assert median_busbw_ratio(rows, alone_only=False) == pytest.approx(0.2)  # of 0.5, 0.2, 0.0004
