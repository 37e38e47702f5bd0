"""The comm hook an attached run puts on each DistributedDataParallel: it times every bucket and
keeps the training exactly as it was.

`timed_comm_hook` is the one function DDP calls per bucket (one place, so it can be unified with
the launched runs' hooks in `engine.modes.ddp`). It records the bucket with the engine's
`engine.modes.ddp.comm_hook.BucketRecorder` (ready, all-reduce start and end, in seconds from
the synced backward's start), then:

- when the script registered no hook, does what DDP's built-in path does: multiplies the bucket
  by 1/world_size (DDP's reducer multiplies by the same reciprocal while copying each gradient
  into its bucket, `Reducer::mark_variable_ready_dense`, skipped once a hook is registered) and
  all-reduces it (sum) on DDP's own process group, so the gradients are bitwise the ones
  DDP would have produced;
- when the script registered its own hook (fp16/bf16 compression, PowerSGD), calls it unchanged
  (`engine.attach.ddp` keeps the script's `register_comm_hook` call and hands the hook here).
  The bytes are counted from the tensors that hook hands to `torch.distributed.all_reduce`, in its
  call and in the callbacks it chains on those collectives' futures (PowerSGD's P and Q), by the
  launched runs' tap (`engine.modes.ddp.comm_hooks.run_tapped`; fp16 compression halves them);
  all-reduce start is the first such call, and the end is when the script's future completes (so
  it includes the hook's decompression); `nbytes_source` says
  which. DDP does the rest as it would have.

The recording runs under the session's guard: an error in it switches bucket timing off and the
all-reduce still happens (a hook that skipped it would hang every rank).
"""

from typing import Any, Callable

import torch
import torch.distributed as dist

from ddpviz.engine.attach.session import PickledAsDetached
from ddpviz.engine.modes.ddp.comm_hook import BucketRecorder
from ddpviz.engine.modes.ddp.comm_hooks import run_tapped

BUCKET_BYTES = "bucket buffer (DDP's flat gradients, float32 here)"
HOOK_BYTES = "tensors the script's comm hook handed to torch.distributed.all_reduce"
# DDP hands a sparse gradient's bucket over as the COO gradient itself (`Reducer::mark_variable_ready_sparse`): its
# bytes are its values' and indices' (`engine.modes.ddp.comm_hook`), not a flat buffer's (said so until 2026-12-06)
SPARSE_BYTES = "sparse gradient: its values and indices (DDP hands the COO gradient itself to the hook)"


class HookState(PickledAsDetached):
    """What `timed_comm_hook` needs for one DDP.

    Args:
        recorder: a `BucketRecorder` with ``predivided=True`` (this module scales, not it) and
            DDP's process group.
        guard: `engine.attach.session.Session.guard`.
        user_hook, user_state: the script's own hook and its state, or None.
    """

    def __init__(self, recorder: BucketRecorder, guard: Callable[..., Any], world_size: int):
        self.recorder, self.guard = recorder, guard
        self.scale = 1.0 / world_size
        self.user_hook: Callable | None = None
        self.user_state: Any = None
        self.user_builtin = False  # the script's hook is a built-in one's Python twin (engine.attach.ddp)
        self.sparse = False  # the model has a sparse gradient (set by engine.attach.ddp): buckets checked for it
        self.synced_backwards = 0  # backward passes whose buckets were recorded


def _record(state: HookState, bucket: dist.GradBucket) -> dict:
    rec = state.recorder._record(bucket)
    rec["uncompressed_nbytes"] = rec["nbytes"]
    rec["nbytes_source"] = HOOK_BYTES if state.user_hook is not None else \
        SPARSE_BYTES if state.sparse and bucket.buffer().is_sparse else BUCKET_BYTES
    if state.user_hook is not None:
        rec["nbytes"] = 0
    return rec


def _ended(state: HookState, rec: dict, fut: torch.futures.Future, tap: Any) -> torch.futures.Future:
    def done(f: torch.futures.Future):
        rec["comm_end"] = state.recorder.clock.mark()
        if tap.first is None:  # the hook called no all_reduce we could see
            rec["comm_start"] = rec["ready"]
            rec["nbytes"], rec["nbytes_source"] = rec["uncompressed_nbytes"], BUCKET_BYTES + " (the script's hook "\
                "handed no tensor to torch.distributed.all_reduce)"
        else:
            rec["comm_start"], rec["nbytes"] = tap.first, tap.nbytes
        return f.value()

    return fut.then(done)


# No `from __future__ import annotations` in this module: DDP checks this signature's real annotation types.
def timed_comm_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The hook given to `DistributedDataParallel.register_comm_hook(state, timed_comm_hook)`
    (see the module docstring)."""
    rec = state.guard("bucket timing", _record, state, bucket)
    if state.user_hook is None:
        buf = bucket.buffer()
        buf.mul_(state.scale)
        if rec is not None:
            return state.recorder._launch(buf, rec)
        group = state.recorder.group or dist.group.WORLD
        return group.allreduce([buf]).get_future().then(lambda f: f.value()[0])
    if rec is None:
        return state.user_hook(state.user_state, bucket)
    fut, tap = run_tapped(state.user_hook, state.user_state, bucket, state.recorder.clock)
    return state.guard("bucket timing", _ended, state, rec, fut, tap) or fut
