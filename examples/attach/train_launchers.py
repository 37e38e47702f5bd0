"""A DDP script started by a launcher other than torchrun (issue 32.2), for `ddpviz run -- python
train_launchers.py --launcher L`:

- ``spawn``: `torch.multiprocessing.spawn` starts 2 workers; the parent trains nothing.
- ``relaunch``: as Lightning's subprocess launcher (`_SubprocessScriptLauncher`) does: the script,
  as local rank 0, starts itself again for local rank 1 (LOCAL_RANK, NODE_RANK, WORLD_SIZE,
  MASTER_ADDR, MASTER_PORT in the child's environment; no RANK) and trains too.

Each rank: gloo, a small MLP in DDP, 4 SGD steps of 8 samples. TRAIN_REPORT=PATH.json: each rank
writes PATH.rankR.json (its pid, its parent's pid, steps, losses, samples per step, the spool's
event files once every rank trained).
"""

import argparse
import json
import os
import socket
import subprocess
import sys

import torch
import torch.distributed as dist

STEPS, BATCH, WORLD = 4, 8, 2


def train(rank: int) -> None:
    torch.manual_seed(0)
    ddp = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    losses = []
    for _ in range(STEPS):
        x = torch.randn(BATCH, 4, generator=g)
        loss = ddp(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    dist.barrier()  # every rank trained: the spool holds what it will hold
    report = os.environ.get("TRAIN_REPORT")
    if report:
        spool = os.environ.get("DDPVIZ_ATTACH_SPOOL")
        files = sorted(f for f in os.listdir(spool) if f.startswith("events-")) if spool else []
        with open(report.replace(".json", f".rank{rank}.json"), "w") as fh:
            json.dump({"pid": os.getpid(), "ppid": os.getppid(), "steps": STEPS, "losses": losses,
                       "samples": [BATCH] * STEPS, "spool_files": files}, fh)
    dist.barrier()
    dist.destroy_process_group()


def spawned(rank: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    train(rank)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def relaunched() -> None:
    child = None
    if "LOCAL_RANK" not in os.environ:  # the script as started: local rank 0, starts the others
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        env = dict(os.environ, LOCAL_RANK="1", NODE_RANK="0", WORLD_SIZE=str(WORLD))
        child = subprocess.Popen([sys.executable, *sys.argv], env=env)
    rank = int(os.environ.get("LOCAL_RANK", 0))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    train(rank)
    if child is not None and child.wait() != 0:
        raise SystemExit(f"local rank 1 exited with {child.returncode}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--launcher", choices=("spawn", "relaunch"), required=True)
    args = ap.parse_args()
    if args.launcher == "spawn":
        torch.multiprocessing.spawn(spawned, args=(free_port(),), nprocs=WORLD)
    else:
        relaunched()


if __name__ == "__main__":
    main()
