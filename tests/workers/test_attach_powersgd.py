"""`ddpviz run` on a script with PyTorch's PowerSGD comm hook: each step's all-reduce bytes (`comm_volume`) are
every byte the hook all-reduced, its second pass (Q, launched from a future's callback after the hook returned)
included. Reference: the script's own count of the bytes it passes to `torch.distributed.all_reduce` in each
step, in a run without ddpviz. Before 2026-12-06 a step read 772 B where the script counted 1,604, then (a race, once
in CI) 1,092 B.
"""

from __future__ import annotations

import textwrap

import pytest
from attach_tools import plain_and_attached


pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent("""
    import json, sys
    import torch, torch.distributed as dist, torch.nn as nn
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    original, counted = dist.all_reduce, [0]

    def all_reduce(t, *args, **kwargs):  # the script's own count of what it all-reduces
        counted[0] += t.numel() * t.element_size()
        return original(t, *args, **kwargs)

    dist.all_reduce = all_reduce
    torch.manual_seed(0)
    ddp = DDP(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)))
    state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=3,
                               use_error_feedback=True, warm_start=True, random_seed=0)
    ddp.register_comm_hook(state, psgd.powerSGD_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(dist.get_rank())
    per_step = []
    for _ in range(8):
        counted[0] = 0
        loss = ddp(torch.randn(8, 16, generator=g)).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        per_step.append(counted[0])
    if dist.get_rank() == 0:
        print("COUNTED " + json.dumps(per_step), flush=True)
    dist.barrier(); dist.destroy_process_group()
""")


def test_powersgd_steps_count_every_byte_the_hook_all_reduces(tmp_path, redis_url, redis_client):
    from ddpviz.workers.client import DdpvizClient
    from ddpviz.workers.history import read_all_events

    plain, _, run_id = plain_and_attached(tmp_path, SCRIPT, redis_url)
    counted = [line for line in plain.stdout.splitlines() if line.startswith("COUNTED ")]
    want = __import__("json").loads(counted[0].removeprefix("COUNTED "))
    assert want[3] > 0 and want[3] != want[0]  # from step 3 PowerSGD compresses: P and Q, not the bucket
    events = read_all_events(DdpvizClient(redis=redis_client), run_id)
    got = {e["step"]: e for e in events if e["type"] == "comm_volume" and e.get("rank", 0) == 0}
    assert [got[s]["allreduce_bytes"] for s in range(8)] == want
    buckets = [e for e in events if e["type"] == "bucket" and e.get("rank", 0) == 0]
    per_step = [sum(e["nbytes"] for e in buckets if e["step"] == s) for s in range(8)]
    assert per_step == want  # each bucket's own: P and Q counted for the bucket whose hook launched them
    assert all("comm hook" in e["nbytes_source"] for e in buckets)
