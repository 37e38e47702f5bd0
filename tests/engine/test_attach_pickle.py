"""A script that saves its DDP or model whole (`torch.save(ddp)`, `pickle.dumps`, `copy.deepcopy`) does so
attached as without ddpviz, and the copy trains to the same numbers. Reference: the same script in a process
without ddpviz. Before 2026-12-06 the attached save failed ("cannot pickle '_io.FileIO' object"): the DDP's
forward hooks, `_ddpviz_watch` and comm hook state reached ddpviz's open event file. Not covered: a save
inside a memory-traced step (steps 0-2, every 200th), whose phase hooks are local functions."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = r'''
import copy, io, os, pickle, socket, sys
if sys.argv[1] == "attached":
    from ddpviz.engine.attach import install
    install()
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{port}")
torch.manual_seed(0)
ddp = DDP(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
for _ in range(3):  # whole steps: saved between steps, as checkpoints are
    ddp(torch.randn(2, 4)).sum().backward()
    opt.step()
    opt.zero_grad()
x = torch.ones(3, 4)
for how, save in (("torch.save", lambda m: (lambda b: (torch.save(m, b), b.seek(0), torch.load(b, weights_only=False))[2])(io.BytesIO())),
                  ("pickle", lambda m: pickle.loads(pickle.dumps(m))), ("deepcopy", copy.deepcopy)):
    for what, m in (("ddp", ddp), ("model", ddp.module)):
        try:
            print(how, what, f"{save(m)(x).sum().item():.6f}")
        except Exception as exc:
            print(how, what, type(exc).__name__, exc)
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
'''


def _run(tmp_path, how: str) -> list[str]:
    spool = tmp_path / how
    spool.mkdir()
    out = subprocess.run([sys.executable, "-c", SCRIPT, how], capture_output=True, text=True, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "DDPVIZ_ATTACH_RUN_ID": "pickle",
                              "DDPVIZ_ATTACH_SPOOL": str(spool), "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    return [line for line in out.stdout.splitlines() if line.split(" ")[0] in ("torch.save", "pickle", "deepcopy")]


def test_a_ddp_or_model_saved_whole_is_saved_and_loads_as_without_ddpviz(tmp_path):
    plain, attached = _run(tmp_path, "plain"), _run(tmp_path, "attached")
    assert len(plain) == 6 and all(len(line.split(" ")) == 3 for line in plain), plain  # every save worked
    assert attached == plain
