"""`ddpviz run --probe`'s sizes: they span the run's bucket sizes (issue 24, Theory)."""

from __future__ import annotations

import pytest

from ddpviz.engine.attach.probe import probe_range
from ddpviz.engine.modes.ddp.probe import PROBE_MAX_BYTES, PROBE_MIN_BYTES, probe_sizes


@pytest.mark.parametrize("buckets", [[1028, 262_144], [4, 40], [5_000, 100 * 2**20], [PROBE_MIN_BYTES]])
def test_probe_sizes_span_every_bucket_and_at_least_the_default_range(buckets):
    low, high = probe_range(buckets)
    sizes = probe_sizes(low, high)  # the probe's own size list (and its argument checks)
    assert sizes[0] <= min(buckets) and sizes[-1] >= max(buckets)
    assert sizes[0] <= PROBE_MIN_BYTES and sizes[-1] >= PROBE_MAX_BYTES
    assert sizes[0] * 2 > min(min(buckets), PROBE_MIN_BYTES)  # no smaller than needed


def test_without_buckets_the_probe_keeps_its_defaults():
    assert probe_range([]) == (PROBE_MIN_BYTES, PROBE_MAX_BYTES)
