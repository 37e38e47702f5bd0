"""What DP's replicas write to module state, and device 0 never sees.

`torch.nn.DataParallel`'s documentation (torch/nn/parallel/data_parallel.py): a module's forward
runs on replicas that are "destroyed after forward", so a counter incremented in forward "will
always stay at the initial value", while "in-place updates to the parameters or buffers on
device[0] will be recorded". So a buffer rebound in forward (`self.calls = self.calls + 1`) is
lost on every device, device 0 included; one updated in place (BatchNorm's running statistics)
keeps device 0's update and loses the others'.

`discarded_buffers` measures it: after a replica's forward, each of its buffers against device
0's module's buffer of the same name; any that differ hold an update DP throws away with the
replica. `BufferWatch` keeps the names seen so far and emits one `log` event the first time.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn as nn

from ddpviz.engine.measure.telemetry import Telemetry


def discarded_buffers(master: nn.Module, replicas: Sequence[nn.Module]) -> list[str]:
    """Names of `master`'s buffers that some replica holds with another value, shape or dtype
    (compare after the replicas' forward, before they are dropped). Buffers on another device
    are compared on `master`'s device; a buffer a replica no longer has counts as discarded."""
    out = []
    held = [dict(r.named_buffers()) for r in replicas]
    with torch.no_grad():
        for name, ref in master.named_buffers():
            for mine in held:
                b = mine.get(name)
                if b is None or b.shape != ref.shape or b.dtype != ref.dtype or not torch.equal(b.to(ref.device), ref):
                    out.append(name)
                    break
    return out


CHECKED = ("each replica's parameters as it computed with them (this step's broadcast copies of "
           "device 0's, after forward and backward) against device 0's: they differ only if something "
           "wrote to a replica after the copy (fault=diverge, an in-place write in forward)")

LOG_MESSAGE = "DP discards buffer updates made on replicas: {n} buffer(s)"


class BufferWatch:
    """The buffers whose replica updates DP discarded so far in a run (`count`), and the one
    `log` event (`LOG_MESSAGE`, with `buffers_discarded` and the buffer names) at the first."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.logged = False

    @property
    def count(self) -> int:
        return len(self.names)

    def observe(self, master: nn.Module, replicas: Sequence[nn.Module]) -> None:
        for name in discarded_buffers(master, replicas):
            if name not in self.names:
                self.names.append(name)

    def report(self, tel: Telemetry, step: int) -> None:
        """Emit the `log` event once, at the first step that found a discarded update."""
        if self.names and not self.logged:
            self.logged = True
            tel.emit("log", step=step, level="warning", message=LOG_MESSAGE.format(n=self.count),
                     buffers_discarded=self.count, buffers=list(self.names),
                     source="measured: each replica's buffers after its forward against device 0's module")

    def emit_sync(self, tel: Telemetry, step: int, sums: list[float] | None) -> None:
        """The step's `sync` event from each replica's parameter checksum (`sums`, one per device,
        taken after its forward; None on unchecked steps: nothing is emitted), with the discarded
        buffers found so far. DP rebuilds its replicas from device 0 every step
        (torch/nn/parallel/data_parallel.py: `replicate` in `forward`)."""
        if sums is None:
            return
        self.report(tel, step)
        tel.emit("sync", step=step, checksums=sums, in_sync=all(s == sums[0] for s in sums),
                 checked=CHECKED, replicas_rebuilt_each_step=True, buffers_discarded=self.count)
