"""A DDP that reduces in several synced backwards of one step (two losses, each `backward()`ed
outside `no_sync()`, one optimizer step): the step's `comm_volume` counts every backward's bytes
(issue 32.5; it counted the last one only: 4,569,156 of 6,740,040 B on a real script). Reference:
the bytes of each backward's own buckets, and the model's gradient bytes (each synced backward of
a one-bucket-per-layer DDP all-reduces every gradient once)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from ddpviz.engine.attach.env import RUN_ID_ENV, SPOOL_ENV, STARTUP_DIR
from ddpviz.engine.components.ports import free_port

SCRIPT = """
import torch, torch.distributed as dist, torch.nn as nn
dist.init_process_group("gloo")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 8))
ddp = nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
for step in range(4):
    for half in range(2):  # two synced backwards of one step
        ddp(torch.randn(8, 32)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
"""


def test_every_synced_backward_of_a_step_counts_in_its_comm_volume(tmp_path):
    script, spool = tmp_path / "train.py", tmp_path / "spool"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPVIZ_ATTACH")}
    env.update({RUN_ID_ENV: "r", SPOOL_ENV: str(spool), "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "PYTHONPATH": str(STARTUP_DIR)})
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    events = [json.loads(line) for f in spool.glob("events-*.jsonl") for line in f.read_text().splitlines()]
    volume = {e["step"]: e["allreduce_bytes"] for e in events if e["type"] == "comm_volume"}
    steps = [e for e in events if e["type"] == "step"]
    assert [e["micro_steps"] for e in steps] == [2] * 4 and sorted(volume) == [0, 1, 2, 3]
    grad_bytes = (32 * 64 + 64 + 64 * 8 + 8) * 4  # fp32 gradients, every one reduced per synced backward
    last_backward = {s: sum(e["nbytes"] for e in events if e["type"] == "bucket" and e["step"] == s) for s in volume}
    assert all(b == grad_bytes for b in last_backward.values())  # the buckets written: the last backward's
    assert volume == {s: 2 * grad_bytes for s in range(4)}  # both backwards' bytes
