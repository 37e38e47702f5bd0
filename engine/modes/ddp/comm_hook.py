"""A DDP communication hook that all-reduces each gradient bucket and records when it happened.

It keeps DDP's semantics: each rank's bucket is divided by world_size once and all-reduced (sum),
so every rank ends with the mean gradient. PyTorch's default Python `allreduce_hook`
(torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py) divides the flat bucket in the hook,
an extra read and write of every gradient byte (1.1-1.4 ms per step for the 21 MB of mlp 1024x6 on
this 2-core machine, ~2.5% of its step); DDP's built-in path fuses the division into the copy of
each gradient into its bucket (reducer.cpp, `copy_grad_to_bucket`, skipped once a hook is
registered). With `predivided=True` the caller scales the loss by 1/world_size before backward
(gradient pre-division, apex DDP's `gradient_predivide_factor`), so the gradients reach the bucket
already divided and the hook only sums: no pass over the bucket at all.

DDP calls hooks in bucket-index order as buckets become ready during backward
(`Reducer::mark_bucket_ready`), so `bucket.is_last()` marks the last one of the step.

With `overlap=False` every all-reduce is deferred until the last bucket is ready: the hook returns
futures it completes later, showing on the same model what overlap buys.

Another hook (fp16, PowerSGD, a user's) runs inside this one's timing when composed
(`engine.modes.ddp.comm_hooks.compose`, which sets `inner`).

Times are seconds from the step's backward start (`BucketRecorder.begin_backward`). On CPU they
are host clock readings; on CUDA, events recorded on the current stream (resolved after the step).

Per bucket and step the hook takes three clock marks and builds one small dict. With a
`engine.measure.gil_rank.MeteredClock` (launched ranks), only the last bucket's ready mark also reads the
thread's clocks (the one `rank_step_fields` splits the backward at); the others are time-only. The bucket's
parameter names (a loop over `GradBucket.parameters()`) are read only on the first
`LAYOUT_STEPS` backward passes: DDP fixes its bucket layout by then (it rebuilds buckets once, in
the second iteration's forward, `Reducer::rebuild_buckets`, and never again).
"""

from typing import Any, Callable

import torch
import torch.distributed as dist

from ddpviz.engine.measure.clocks import HostClock

# the `bucket` events' `source` on this path: every field measured, on every step
HOOK_SOURCE = "comm hook (Python): ready, all-reduce start and end measured"
LAYOUT_STEPS = 3  # backward passes whose buckets' parameter names are read (DDP rebuilds once, in pass 2)


def wire_nbytes(buf: torch.Tensor) -> int:
    """Bytes an all-reduce of `buf` carries per rank: a dense bucket's flat buffer, or a sparse
    gradient's values and indices (DDP hands a sparse bucket over as the COO gradient itself,
    `Reducer::mark_variable_ready_sparse`; `numel()` would count its dense shape)."""
    if buf.is_sparse:
        values, indices = buf._values(), buf._indices()
        return values.numel() * values.element_size() + indices.numel() * indices.element_size()
    return buf.numel() * buf.element_size()


class BucketRecorder:
    """State of the recording hook for one rank.

    Args:
        world_size: ranks in the process group (the divisor that turns the sum into a mean).
        overlap: all-reduce each bucket as soon as it is ready (True) or after the last one (False).
        names: parameter name by `data_ptr()`, to name each bucket's parameters.
        clock: `HostClock()` on CPU, `CudaClock()` on CUDA.
        predivided: the caller scaled the loss by 1/world_size, so the hook does not divide.
    """

    def __init__(self, world_size: int, overlap: bool, names: dict[int, str], clock=None,
                 group=None, predivided: bool = False):
        self.world_size, self.overlap, self.names = world_size, overlap, names
        self.predivided = predivided
        self.passes = 0  # backward passes begun
        self.clock = clock or HostClock()
        self._time_mark = getattr(self.clock, "time_mark", self.clock.mark)  # no thread clocks
        self.group = group
        self.records: list[dict[str, Any]] = []
        self.pending: list[tuple[torch.Tensor, dict, torch.futures.Future]] = []
        self.layout: dict[int, tuple[str, ...]] = {}  # bucket index -> parameter names last seen
        self.origin: Any = None
        self.inner = None  # a composed comm hook (`engine.modes.ddp.comm_hooks.compose`), run per bucket

    def begin_backward(self) -> None:
        """Call right before the backward whose buckets should be recorded."""
        self.records, self.pending = [], []
        self.passes += 1
        self.origin = self._time_mark()

    def _record(self, bucket: dist.GradBucket) -> dict[str, Any]:
        is_last = bucket.is_last()
        ready = self.clock.mark() if is_last else self._time_mark()
        index = bucket.index()
        rec: dict[str, Any] = dict(bucket_index=index, nbytes=wire_nbytes(bucket.buffer()),
                                   is_last=is_last, ready=ready)
        if self.passes <= LAYOUT_STEPS or index not in self.layout:
            names = tuple(self.names.get(p.data_ptr(), "?") for p in bucket.parameters())
            if self.layout.get(index) != names:
                self.layout[index] = names
                rec["param_names"] = list(names)
        rec["num_params"] = len(self.layout[index])
        self.records.append(rec)
        return rec

    def _launch(self, buf: torch.Tensor, rec: dict) -> torch.futures.Future:
        rec["comm_start"] = self._time_mark()
        if not self.predivided:
            buf.div_(self.world_size)
        # the process group's own allreduce (SUM): what `dist.all_reduce(async_op=True)` calls after
        # its Python-side argument checks, which would otherwise run on every bucket of every step
        fut = (self.group or dist.group.WORLD).allreduce([buf]).get_future()

        def done(f: torch.futures.Future) -> torch.Tensor:
            rec["comm_end"] = self._time_mark()
            return f.value()[0]

        return fut.then(done)

    def hook(self, bucket: dist.GradBucket) -> torch.futures.Future:
        rec = self._record(bucket)
        if self.inner is not None:
            return self.inner(bucket, rec)
        buf = bucket.buffer()
        if self.overlap:
            return self._launch(buf, rec)
        fut: torch.futures.Future = torch.futures.Future()
        self.pending.append((buf, rec, fut))
        if bucket.is_last():  # every bucket is ready: now run the deferred all-reduces in order
            for b, r, f in self.pending:
                r["comm_start"] = self._time_mark()
                if not self.predivided:
                    b.div_(self.world_size)
                dist.all_reduce(b, group=self.group)
                r["comm_end"] = self._time_mark()
                f.set_result(b)
            self.pending = []
        return fut

    def resolved(self) -> list[dict[str, Any]]:
        """This step's records with times in seconds from backward start (call after the step, once
        its marks completed: on CUDA `Event.elapsed_time` needs both events done)."""
        return self._resolve(self.records, self.origin)

    def taken(self) -> Callable[[], list[dict[str, Any]]]:
        """`resolved` of this backward's records, to call later (once its marks completed): the next
        `begin_backward` starts new records and a new origin, these are kept."""
        records, origin = self.records, self.origin
        return lambda: self._resolve(records, origin)

    def _resolve(self, records: list[dict[str, Any]], origin: Any) -> list[dict[str, Any]]:
        out = []
        for r in records:
            e = {k: (bool(v) if isinstance(v, torch.Tensor) else v) for k, v in r.items()
                 if k not in ("ready", "comm_start", "comm_end")}
            for k, key in (("ready", "ready_s"), ("comm_start", "comm_start_s"), ("comm_end", "comm_end_s")):
                e[key] = self.clock.seconds(origin, r[k]) if k in r else None
            e["source"] = HOOK_SOURCE
            out.append(e)
        return out


# No `from __future__ import annotations` here: DDP checks this signature's real annotation types.
def recording_hook(state: BucketRecorder, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The function given to `DistributedDataParallel.register_comm_hook(state, hook)`."""
    return state.hook(bucket)
