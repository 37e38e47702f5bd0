"""An attached script's comm hook (`engine.attach.comm`): every byte it hands to `torch.distributed.all_reduce`
counts for its bucket, those its futures' callbacks launch included (PowerSGD's P and Q), on whatever thread
and whenever those callbacks run.

Red before 2026-12-06: the attach path had its own tap, which counted a callback's all-reduce only while a
per-process "pending" count was up, begun after the hook returned; a callback gloo ran before that was counted
nowhere (CI: a PowerSGD step read 1,092 B where the script counted 1,604; the 512 B missing were P's). And
with the launched runs' tap already installed in the process, the attach tap stood aside and counted nothing.
Now both paths use one tap (`engine.modes.ddp.comm_hooks.run_tapped`).

Reference: the bytes the hook below hands to `torch.distributed.all_reduce`, counted by hand.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from ddpviz.engine.modes.launcher import free_port


def _powersgd_like_hook(state, bucket):
    """Like PyTorch's `powerSGD_hook`: 64 B all-reduced in the call, 40 B launched in it, 24 B launched
    from that all-reduce's callback (gloo runs it on its own thread once the 40 B are reduced), waited for
    before the hook returns so the callback certainly ran before it."""
    dist.all_reduce(torch.zeros(16))
    first = dist.all_reduce(torch.zeros(10), async_op=True).get_future()
    second = first.then(lambda f: dist.all_reduce(torch.zeros(6), async_op=True).get_future().wait()[0])
    out = second.then(lambda f: bucket.buffer())
    out.wait()
    return out


@pytest.mark.parametrize("launched_tap_first", [False, True])
def test_every_byte_a_script_hook_all_reduces_counts_for_its_bucket(launched_tap_first):
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddpviz.engine.attach.comm import HOOK_BYTES, HookState, timed_comm_hook
    from ddpviz.engine.measure.clocks import HostClock
    from ddpviz.engine.modes.ddp.comm_hook import BucketRecorder
    from ddpviz.engine.modes.ddp.comm_hooks import compose
    from ddpviz.engine.modes.ranks import leave_process_group

    if dist.is_initialized():
        pytest.skip("a process group exists already")
    original = dist.all_reduce
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        if launched_tap_first:  # a launched run's hook ran in this process before
            hook = compose(BucketRecorder(1, True, {}, HostClock()),
                           lambda state, bucket: dist.all_reduce(torch.zeros(1), async_op=True).get_future(), None)
            hook(None, {"nbytes": 4}).wait()
        ddp = DDP(torch.nn.Linear(8, 1))  # one bucket of 36 B
        recorder = BucketRecorder(1, True, {}, HostClock(), predivided=True)
        state = HookState(recorder, lambda part, fn, *args: fn(*args), 1)
        state.user_hook = _powersgd_like_hook
        ddp.register_comm_hook(state, timed_comm_hook)
        for step in range(3):
            recorder.begin_backward()
            ddp(torch.randn(4, 8)).sum().backward()
            got = recorder.records
            assert [(r["nbytes"], r["uncompressed_nbytes"], r["nbytes_source"]) for r in got] == [(128, 36, HOOK_BYTES)]
            assert got[0]["ready"] <= got[0]["comm_start"] <= got[0]["comm_end"], step
    finally:
        dist.all_reduce = original
        leave_process_group()
