"""A script comm hook's all-reduces that run on another thread (`engine.attach.comm`): PowerSGD launches P and Q
from its futures' callbacks, which run on the thread that completes the future (gloo's), possibly before the hook
has returned. Each such byte must be counted once, for the step.

Red before 2026-12-06: the pending count began only after the hook returned, so a callback that ran earlier was
counted nowhere (CI: a PowerSGD step read 1,092 B where the script counted 1,604; the 512 B missing were P's).

Reference: the bytes the hook below hands to `torch.distributed.all_reduce`, counted by hand.
"""

from __future__ import annotations

import threading

import pytest
import torch
import torch.distributed as dist

from ddpviz.engine.modes.launcher import free_port


def _hook_with_a_callback_on_another_thread(state, bucket):
    """64 B all-reduced on the training thread, then 40 B from a future's callback that another thread runs
    (it completes the future) before this hook returns."""
    dist.all_reduce(torch.zeros(16))
    started: torch.futures.Future = torch.futures.Future()
    late = started.then(lambda f: dist.all_reduce(torch.zeros(10)) or bucket.buffer())
    thread = threading.Thread(target=started.set_result, args=(None,))
    thread.start()
    thread.join()
    return late


def test_bytes_a_hooks_callback_all_reduces_on_another_thread_count_once_for_the_step():
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddpviz.engine.attach.comm import HookState, take_late_bytes, tap_all_reduce, timed_comm_hook
    from ddpviz.engine.measure.clocks import HostClock
    from ddpviz.engine.modes.ddp.comm_hook import BucketRecorder
    from ddpviz.engine.modes.ranks import leave_process_group

    if dist.is_initialized():
        pytest.skip("a process group exists already")
    original = dist.all_reduce
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        tap_all_reduce()
        ddp = DDP(torch.nn.Linear(8, 1))  # one bucket
        recorder = BucketRecorder(1, True, {}, HostClock(), predivided=True)
        state = HookState(recorder, lambda part, fn, *args: fn(*args), 1)
        state.user_hook = _hook_with_a_callback_on_another_thread
        ddp.register_comm_hook(state, timed_comm_hook)
        take_late_bytes()
        for step in range(3):
            recorder.begin_backward()
            ddp(torch.randn(4, 8)).sum().backward()
            assert [r["nbytes"] for r in recorder.records] == [64], step  # the hook's own, on this thread
            assert take_late_bytes() == (40, 1), step  # the callback's, once
        dist.all_reduce(torch.zeros(4))  # no hook future pending: not a late byte
        assert take_late_bytes() == (0, 0)
    finally:
        dist.all_reduce = original
        leave_process_group()
