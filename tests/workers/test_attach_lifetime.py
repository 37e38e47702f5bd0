"""`ddpviz run` on a script that destroys its process group and makes a new one (two trainings in one
process). Reference: the same script run plainly (each training's checksum to 10 digits); the run records
both trainings' steps.

A report of 2026-12-06 said the attached script hung in the second DDP's first collective. Under torchrun's
own store (`init_process_group("gloo")` twice, env://) plain torch 2.13 hangs there too, in 5 of 10 tries
here: the second group's store keys meet the first's. With a store of its own per group (as below) neither
hangs: plain 6 of 6, attached 3 of 3 (and 4 of 4 with a release of ddpviz's references at destroy, not kept).
"""

from __future__ import annotations

import textwrap

import pytest
from attach_tools import plain_and_attached


pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent("""
    import os, sys
    import torch, torch.distributed as dist, torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    def train(tag):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
        ddp = DDP(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        g = torch.Generator().manual_seed(dist.get_rank())
        for _ in range(10):
            x, y = torch.randn(8, 16, generator=g), torch.randn(8, 1, generator=g)
            loss = ((ddp(x) - y) ** 2).mean()
            opt.zero_grad(); loss.backward(); opt.step()
        if dist.get_rank() == 0:
            print(f"CHECKSUM{tag} {sum(p.double().sum().item() for p in model.parameters()):.10g}", flush=True)

    for tag in ("1", "2"):  # a store of its own each time (torchrun's: plain torch hung in 5 of 10 re-inits)
        store = f"file://{sys.argv[1]}.{os.getppid()}.{tag}"  # the ranks' parent: their torchrun, one per run
        dist.init_process_group("gloo", init_method=store, rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]))
        train(tag)
        dist.barrier()
        dist.destroy_process_group()
""")


def test_a_second_process_group_after_destroy_trains_as_without_ddpviz_and_both_trainings_are_recorded(
        tmp_path, redis_url, redis_client):
    from ddpviz.workers.client import DdpvizClient

    plain, attached, run_id = plain_and_attached(tmp_path, SCRIPT, redis_url, str(tmp_path / "pg"))
    assert "without closing its record" not in attached.stderr  # every rank closed its record at exit
    sums = [[line for line in p.stdout.splitlines() if line.startswith("CHECKSUM")] for p in (plain, attached)]
    assert sums[0] == sums[1] and len(sums[0]) == 2
    record = DdpvizClient(redis=redis_client).get_run(run_id)
    assert record["status"] == "succeeded" and record["summary"]["steps_done"] == 20


EXITS = textwrap.dedent("""
    import os
    import torch, torch.distributed as dist, torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    ddp = DDP(nn.Linear(4, 1))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for _ in range(5):
        ddp(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
    dist.barrier()
    os._exit(0)  # no atexit, no flush: what some scripts do to skip a slow teardown
""")


def test_a_rank_that_ends_with_os_exit_is_said_to_have_left_its_record_open(tmp_path, redis_url, redis_client):
    """Reference: the script's own exit code, 0 with and without ddpviz. The record may miss the rank's last
    events (the writer flushes every 0.1 s); before 2026-12-06 nothing said so and a run of 0 recorded steps
    read as a whole success."""
    from ddpviz.workers.client import DdpvizClient
    from ddpviz.workers.history import read_all_events

    _, attached, run_id = plain_and_attached(tmp_path, EXITS, redis_url)
    said = [line for line in attached.stderr.splitlines() if "ended without closing its record" in line]
    assert sorted(line.split()[2] for line in said) == ["0", "1"], attached.stderr[-3000:]  # "ddpviz: rank N"
    logs = [e for e in read_all_events(DdpvizClient(redis=redis_client), run_id) if e["type"] == "log"]
    assert sorted(e["rank"] for e in logs if "without closing its record" in e.get("message", "")) == [0, 1]
    assert not list((tmp_path / "spool").glob("open-rank*"))
