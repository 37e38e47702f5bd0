"""Intervals for medians of step times: one home for the bench's overhead figure
(`engine.harness.overhead`) and the DP vs DDP verdict (`engine.verdict`).

Pure Python (no torch, no numpy), so the app can use it. Step times on a shared machine drift
over seconds, so neighbouring steps are not independent: a *block* bootstrap resamples runs of
`block` consecutive values (Künsch 1989; non-overlapping blocks, Carlstein 1986), which keeps
that drift inside each resample. The interval is the percentile interval of the resampled
statistic (Efron & Tibshirani 1993, ch. 13). Seeded, so the same samples give the same interval.
"""

from __future__ import annotations

import random
import statistics
from typing import Callable, Sequence

BOOTSTRAP_RESAMPLES = 2000


def block_medians(step_starts: Sequence[float], block_steps: int) -> list[float]:
    """Median step interval (s) of each block: the intervals between consecutive step starts
    inside the block, the first one (right after the wait for a turn) dropped.

    Args:
        step_starts: every step's start time, in step order (len = blocks x block_steps).
        block_steps: steps per block (>= 4, so each block keeps >= 2 intervals).

    Raises:
        ValueError: block_steps < 4, or the starts are not a whole number of blocks.
    """
    if block_steps < 4:
        raise ValueError(f"block_steps must be >= 4 (got {block_steps})")
    if len(step_starts) % block_steps:
        raise ValueError(f"{len(step_starts)} step starts are not a whole number of {block_steps}-step blocks")
    out = []
    for b in range(0, len(step_starts), block_steps):
        s = step_starts[b:b + block_steps]
        out.append(statistics.median([t1 - t0 for t0, t1 in zip(s, s[1:])][1:]))
    return out


def blocks_of(values: Sequence[float], block: int) -> list[list[float]]:
    """`values` cut into consecutive blocks of `block` (the last one shorter if it must be).

    Raises:
        ValueError: block < 1 or no values.
    """
    if block < 1:
        raise ValueError(f"block must be >= 1 (got {block})")
    if not values:
        raise ValueError("no values to cut into blocks")
    return [list(values[i:i + block]) for i in range(0, len(values), block)]


def resampled_medians(values: Sequence[float], block: int, rng: random.Random,
                      resamples: int = BOOTSTRAP_RESAMPLES,
                      stat: Callable[[list[float]], float] = statistics.median) -> list[float]:
    """The median (or `stat`, e.g. `statistics.fmean`) of each of `resamples` block-bootstrap resamples of
    `values` (in resample order): as many blocks as `values` has, drawn with replacement and joined."""
    blocks = blocks_of(values, block)
    out = []
    for _ in range(resamples):
        drawn = rng.choices(blocks, k=len(blocks))
        out.append(stat([v for b in drawn for v in b]))
    return out


def percentile_interval(stats: Sequence[float], level: float = 0.90) -> list[float]:
    """[lo, hi]: the (1-level)/2 and (1+level)/2 percentiles of `stats` (nearest rank below).

    Raises:
        ValueError: level not in (0, 1), or no stats.
    """
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1) (got {level})")
    if not stats:
        raise ValueError("no resampled statistics")
    s = sorted(stats)
    return [s[int((1 - level) / 2 * (len(s) - 1))], s[int((1 + level) / 2 * (len(s) - 1))]]


def median_interval(values: Sequence[float], level: float = 0.90, seed: int = 0,
                    block: int = 1) -> list[float]:
    """Percentile-bootstrap interval of the median of `values` (`BOOTSTRAP_RESAMPLES`
    resamples of blocks of `block` consecutive values; block 1 is the plain bootstrap)."""
    return percentile_interval(resampled_medians(values, block, random.Random(seed)), level)


def ratio_interval(num: Sequence[float], den: Sequence[float], block_num: int, block_den: int,
                   level: float = 0.90, seed: int = 0) -> list[float]:
    """Interval of median(num) / median(den) for two independent series (two runs): each
    resample draws both series' blocks afresh and divides their medians.

    Raises:
        ValueError: an empty series, a block < 1, or a resampled median of `den` that is 0.
    """
    rng = random.Random(seed)
    tops = resampled_medians(num, block_num, rng)
    bottoms = resampled_medians(den, block_den, rng)
    if any(b == 0 for b in bottoms):
        raise ValueError("a resampled median of the denominator is 0")
    return percentile_interval([t / b for t, b in zip(tops, bottoms)], level)


def mean_difference_interval(a: Sequence[float], b: Sequence[float], block_a: int, block_b: int,
                             level: float = 0.90, seed: int = 0) -> list[float]:
    """Interval of mean(a) − mean(b) for two independent series (two runs' step times): each resample
    draws both series' blocks afresh and subtracts their means (means, as a step's parts add up).

    Raises:
        ValueError: an empty series or a block < 1.
    """
    rng = random.Random(seed)
    tops = resampled_medians(a, block_a, rng, stat=statistics.fmean)
    bottoms = resampled_medians(b, block_b, rng, stat=statistics.fmean)
    return percentile_interval([t - u for t, u in zip(tops, bottoms)], level)
