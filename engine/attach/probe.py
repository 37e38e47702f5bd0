"""`ddpviz run --probe`: the all-reduce probe (`engine.modes.ddp.probe`, the one launched DDP runs
use) on the script's own process group, after its last step, so Theory can set the run's buckets
beside what the link does with one collective in flight.

When: as the script destroys its default process group (`dist.destroy_process_group()` is
wrapped: the probe runs first, while the group is still up), or at exit when the script left the
group up. Not when the script trained no step, has one rank, or ends on an uncaught exception.
The probe is a collective: every rank must reach that point, which a script that ends normally
does; that is why it is asked for (`--probe`), not on by default.

Sizes: float32 messages doubling from the largest power of two at or below the run's smallest
bucket (4 KiB at most, the probe's default start) to at least its largest bucket (64 MiB at
least), with the probe's own time budget (`PROBE_BUDGET_S`, which trims the largest sizes first);
the ranks agree on them (an all-reduce with MAX), so every rank probes the same sizes.
The buckets are those of the DDPs this process watched (their latest layout); without a DDP the
probe's default sizes.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import torch
import torch.distributed as dist

from ddpviz.engine.attach.session import Session
from ddpviz.engine.modes.ddp.probe import PROBE_MAX_BYTES, PROBE_MIN_BYTES, emit_probe

_ELEMENT_BYTES = 4  # the probe all-reduces float32


def probe_range(bucket_nbytes: list[int]) -> tuple[int, int]:
    """(min_bytes, max_bytes) of a probe whose sizes cover every size in `bucket_nbytes` (module
    docstring); the probe's defaults when there is none."""
    if not bucket_nbytes:
        return PROBE_MIN_BYTES, PROBE_MAX_BYTES
    low = _ELEMENT_BYTES
    while low * 2 <= min(min(bucket_nbytes), PROBE_MIN_BYTES):
        low *= 2
    high = low
    while high < max(max(bucket_nbytes), PROBE_MAX_BYTES):
        high *= 2
    return low, high


class ProbeAtEnd:
    """Runs the probe once, at the first of: the default group's destruction, exit."""

    def __init__(self, session: Session, tracker: Any):
        self.s, self.tracker = session, tracker
        self.done = False

    def install(self) -> None:
        destroy = dist.destroy_process_group

        @functools.wraps(destroy)
        def destroy_process_group(group=None):
            if group is None or group is dist.group.WORLD:
                self.s.guard("probe", self.run)
            return destroy(group)

        dist.destroy_process_group = destroy_process_group

    def at_exit(self) -> None:
        if getattr(sys, "last_value", None) is None:  # the script did not end on an uncaught exception
            self.run()

    def run(self) -> None:
        if self.done or not dist.is_initialized() or dist.get_world_size() < 2 or self.tracker.step == 0:
            return
        self.done = True
        buckets = [b["nbytes"] for w in self.tracker.watches for b in (getattr(w, "layouts", None) or [[]])[-1]]
        device = self._device()
        low, high = probe_range(buckets)
        agreed = torch.tensor([-low, high], dtype=torch.float64, device=device)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)  # the smallest min, the largest max
        emit_probe(self.s.tel, device, min_bytes=int(-agreed[0].item()), max_bytes=int(agreed[1].item()),
                   run_nbytes=buckets)  # the run's own bucket sizes first, as a launched run's probe

    def _device(self) -> torch.device:
        if dist.get_backend() != "nccl":
            return torch.device("cpu")
        watched = [w.device for w in self.tracker.watches if w.device.type == "cuda"]
        return watched[0] if watched else torch.device("cuda", torch.cuda.current_device())
