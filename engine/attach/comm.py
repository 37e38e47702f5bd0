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
  The bytes are counted from the tensors that hook hands to `torch.distributed.all_reduce`
  (fp16 compression halves them), all-reduce start is the first such call, and the end is when
  the script's future completes (so it includes the hook's decompression); `nbytes_source` says
  which. DDP does the rest as it would have.

The recording runs under the session's guard: an error in it switches bucket timing off and the
all-reduce still happens (a hook that skipped it would hang every rank).
"""

import functools
import threading
from typing import Any, Callable

import torch
import torch.distributed as dist

from ddpviz.engine.attach.session import PickledAsDetached
from ddpviz.engine.modes.ddp.comm_hook import BucketRecorder, wire_nbytes

BUCKET_BYTES = "bucket buffer (DDP's flat gradients, float32 here)"
HOOK_BYTES = "tensors the script's comm hook handed to torch.distributed.all_reduce"
_tap = threading.local()  # .rec: the record of the bucket whose script hook is running, on this thread
# All-reduces a script hook's futures launch from their callbacks, after the hook returned (PowerSGD's second
# pass, Q, in `compute_qs`): no bucket's hook is running then, so they are counted per process while any
# script hook's future is pending, and taken into the step's `comm_volume` (`take_late_bytes`). Before
# 2026-12-06 they were not counted: a PowerSGD step read 772 B where the script's own count was 1,604.
_late = {"pending": 0, "bytes": 0, "calls": 0}
_late_lock = threading.Lock()
LATE_BYTES = ("; + {nbytes:,} B in {calls} all-reduce(s) the hook's futures launched after it returned (counted "
              "for the step, not a bucket)")


def take_late_bytes() -> tuple[int, int]:
    """(bytes, calls) of the all-reduces counted since the last take that no running hook owned, while a
    script hook's future was pending; the count starts again at 0."""
    with _late_lock:
        got = _late["bytes"], _late["calls"]
        _late["bytes"] = _late["calls"] = 0
    return got


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
        self.synced_backwards = 0  # backward passes whose buckets were recorded


def _record(state: HookState, bucket: dist.GradBucket) -> dict:
    rec = state.recorder._record(bucket)
    rec["bucket_nbytes"] = rec["nbytes"]
    rec["nbytes_source"] = BUCKET_BYTES if state.user_hook is None else HOOK_BYTES
    if state.user_hook is not None:
        rec["nbytes"] = 0
    return rec


def _pending(delta: int) -> None:
    with _late_lock:
        _late["pending"] += delta


def _ended(state: HookState, rec: dict, fut: torch.futures.Future) -> torch.futures.Future:
    def done(f: torch.futures.Future):
        _pending(-1)
        rec["comm_end"] = state.recorder.clock.mark()
        if "comm_start" not in rec:  # the hook called no all_reduce we could see
            rec["comm_start"] = rec["ready"]
            rec["nbytes"], rec["nbytes_source"] = rec["bucket_nbytes"], BUCKET_BYTES + " (the script's hook "\
                "handed no tensor to torch.distributed.all_reduce)"
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
    _tap.rec, _tap.clock = rec, state.recorder.clock
    if rec is not None:  # pending from before the hook runs: its futures' callbacks may run on another
        _pending(1)      # thread before it returns (before 2026-12-06 their all-reduces went uncounted)
    try:
        fut = state.user_hook(state.user_state, bucket)
    except BaseException:
        if rec is not None:
            _pending(-1)
        raise
    finally:
        _tap.rec = None
    if rec is None:
        return fut
    ended = state.guard("bucket timing", _ended, state, rec, fut)
    if ended is None:  # no callback to end the pending count
        _pending(-1)
    return ended or fut


def tap_all_reduce() -> None:
    """Wrap `torch.distributed.all_reduce` so the tensors a script's comm hook all-reduces are
    counted for its bucket (only while `timed_comm_hook` runs that hook on this thread; every
    other call goes straight through)."""
    original = dist.all_reduce
    if getattr(original, "_ddpviz_tap", False):
        return

    @functools.wraps(original)
    def all_reduce(tensor, *args, **kwargs):
        rec = getattr(_tap, "rec", None)
        try:
            if rec is not None:
                if "comm_start" not in rec:
                    rec["comm_start"] = _tap.clock.mark()
                rec["nbytes"] += wire_nbytes(tensor)
            elif _late["pending"]:  # launched by a pending hook future's callback (see `_late`)
                with _late_lock:
                    _late["bytes"] += wire_nbytes(tensor)
                    _late["calls"] += 1
        except Exception:
            pass  # counting is optional; the collective is not
        return original(tensor, *args, **kwargs)

    all_reduce._ddpviz_tap = True
    dist.all_reduce = all_reduce
