"""A small deterministic DDP script for the `ddpviz tune` tests: gloo, a 3-layer MLP on fixed
random data, SGD, no bucket_cap_mb given (DDP's default). It trains --steps steps (default 200,
far more than a tune trial's) and then writes done.txt in the working directory, which a trial
stopped by tune never reaches."""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1 + rank)
    x, y = torch.randn(32, 16, generator=g), torch.randn(32, 4, generator=g)
    for _ in range(args.steps):
        loss = nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    if rank == 0:
        with open("done.txt", "w") as fh:
            fh.write("trained\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
