"""What a DDP rank adds to memory tracing and the replica check, kept off the per-step hot path.

- `MemoryBucketRecorder`: the recording comm hook, which also hands the memory ledger the bucket
  buffers DDP's reducer gives the hook (`GradBucket.buffer()`, the flat tensor all-reduced) — on
  the step before a traced step (so a traced step starts with them counted) and during it.
  Other steps pay one attribute test per bucket.
- `BufferProbe`: on check steps, the checksum of every module buffer as the forward starts — after
  DDP's pre-forward broadcast of rank 0's buffers (`broadcast_buffers=True`,
  torch/nn/parallel/distributed.py `_pre_forward` -> `_sync_buffers`) — and after the step (what
  this rank's own forward left in them), all-gathered in `check_sync`.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from ddpviz.engine.measure.ledger import TensorLedger
from ddpviz.engine.measure.memory_sampler import should_trace_memory
from ddpviz.engine.measure.sync import buffer_checksums
from ddpviz.engine.modes.ddp.comm_hook import BucketRecorder


class MemoryBucketRecorder(BucketRecorder):
    """`BucketRecorder` that shows the memory ledger the bucket buffers it is handed.

    `keep` (set for the step before a traced one) keeps each bucket's buffer until the traced
    step starts (`take_kept`); while the ledger is active every buffer is counted on sight, filed
    as "bucket_buffers" (a buffer that is also the gradients' storage, `gradient_as_bucket_view`,
    was counted as "grads" first and stays so: there is no second copy).
    """

    def __init__(self, *args: Any, ledger: TensorLedger | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.ledger, self.keep = ledger, False
        self._kept: dict[int, torch.Tensor] = {}

    def hook(self, bucket: dist.GradBucket) -> torch.futures.Future:
        led = self.ledger
        if self.keep or (led is not None and led.active):
            buf = bucket.buffer()
            if self.keep:
                self._kept[bucket.index()] = buf
            if led is not None and led.active:
                kind = led.kind_of(buf)
                if kind is None:
                    led.add(buf, "bucket_buffers")
                elif kind not in ("grads", "bucket_buffers"):  # first seen as a copy's target
                    led.retag([buf], "bucket_buffers")
        return super().hook(bucket)

    def take_kept(self) -> list[torch.Tensor]:
        """The buffers kept on the last step (then forgotten)."""
        out, self._kept = list(self._kept.values()), {}
        return out


class BufferProbe:
    """Buffer checksums of `model` at the forward's start and after the step, on check steps.

    `at_forward` is taken by a forward pre-hook on the inner module, registered for check steps
    only; with `grad_accum_steps > 1` the last micro-batch's forward (the one DDP syncs) wins.
    """

    def __init__(self, model: nn.Module):
        self.model = model
        self.names = [n for n, _ in model.named_buffers()]
        self.at_forward: torch.Tensor | None = None
        self.after_step: torch.Tensor | None = None

    def wrap(self, train_step: Callable[[int], dict], is_check: Callable[[int], bool]):
        """`train_step` with the probe on the steps `is_check` picks."""
        def step_fn(step: int) -> dict:
            if not self.names or not is_check(step):
                return train_step(step)
            handle = self.model.register_forward_pre_hook(self._record)
            try:
                fields = train_step(step)
            finally:
                handle.remove()
            self.after_step = buffer_checksums(self.model)
            return fields
        return step_fn

    def _record(self, module: nn.Module, args: Any) -> None:
        self.at_forward = buffer_checksums(module)

    def local(self) -> torch.Tensor:
        """(2, n_buffers, 2): [at forward start, after step] x buffer x [Σ, Σ²] (zeros if unseen)."""
        n = len(self.names)
        empty = torch.zeros(n, 2, dtype=torch.float64)
        return torch.stack([self.at_forward if self.at_forward is not None else empty,
                            self.after_step if self.after_step is not None else empty])

    def rows(self, gathered: list[torch.Tensor]) -> list[dict[str, Any]]:
        """One row per (buffer, rank) from every rank's `local()`: the `sync` event's `buffers`."""
        return [dict(name=name, rank=r, at_forward_start=g[0, k].tolist(), after_step=g[1, k].tolist())
                for k, name in enumerate(self.names) for r, g in enumerate(gathered)]


def keep_before_traced(train_step: Callable[[int], dict], rec: MemoryBucketRecorder, steps: int):
    """`train_step` that asks `rec` to keep bucket buffers on each step before a traced step."""
    def step_fn(step: int) -> dict:
        rec.keep = should_trace_memory(step + 1, steps)
        return train_step(step)
    return step_fn
