"""`ddpviz run` on a script that compiles its DDP (`torch.compile(DDP(model))`): the compiled program is the
one the script gets without ddpviz. Reference: the same script run plainly (its final parameters' checksum to
10 digits, its stderr). Before 2026-12-06 TorchDynamo traced ddpviz's forward hooks: a graph break inside
ddpviz with a warning on every rank, an exception under `warnings.filterwarnings("error")`, and a graph that
differed from the plain one (DDPOptimizer's bucket check then passed attached where it failed plainly).
"""

from __future__ import annotations

import textwrap

import pytest
from attach_tools import plain_and_attached
from wtools import REPO

from ddpviz.engine.attach.steps import COMPILED_NOTE

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent("""
    import sys, warnings
    import torch, torch.distributed as dist, torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    warnings.filterwarnings("error")  # any warning ddpviz causes becomes the script's exception
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    ddp = torch.compile(DDP(model), backend="eager")
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(6):
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 1, generator=g)
        loss = ((ddp(x) - y) ** 2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
    if dist.get_rank() == 0:
        print(f"CHECKSUM {sum(p.double().sum().item() for p in model.parameters()):.10g}", flush=True)
    dist.destroy_process_group()
""")


def test_a_compiled_ddp_trains_as_without_ddpviz_and_the_record_says_why_its_steps_are_missing(
        tmp_path, redis_url):
    plain, attached, _ = plain_and_attached(tmp_path, SCRIPT, redis_url, timeout=300)  # attached: 1 before
    sums = [[line for line in p.stdout.splitlines() if line.startswith("CHECKSUM")] for p in (plain, attached)]
    assert sums[0] == sums[1] and len(sums[0]) == 1
    assert "Dynamo does not know" not in attached.stderr and str(REPO / "engine") not in attached.stderr
    assert attached.stderr.count(f"ddpviz: {COMPILED_NOTE}") == 2  # one per rank: its forwards not timed
