"""The wire factors FSDP's `comm_volume` uses, checked against the kernel's loopback counters.

`engine.modes.fsdp.collectives.wire_factor` says a ring all-gather moves (n-1)/n of its output per rank and
that gloo's reduce-scatter moves 2(n-1)/n of its input (gloo runs it as an all-reduce). The
reference is what crossed the loopback interface: n ranks x the per-rank bytes.
"""

import pytest
from fsdp_wire_reference import NUMEL, loopback_bytes

from ddpviz.engine.modes.fsdp.collectives import wire_factor

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("world", [2, 3])
def test_gloo_bytes_on_the_wire_match_the_factors_comm_volume_uses(world, tmp_path):
    measured = loopback_bytes(world, str(tmp_path / "lo.pt"))
    full = NUMEL * 4
    for kind in ("all_gather", "reduce_scatter"):
        derived = world * wire_factor(kind, "gloo", world) * full  # all ranks' sent bytes
        # loopback also carries headers and other processes' traffic: a few percent at most
        assert measured[kind] == pytest.approx(derived, rel=0.1), (kind, measured)
