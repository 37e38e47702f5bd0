"""A DDP script whose bucket cap leaves one bucket: an MLP of 4 square 1024-wide layers (16.8 MB
of float32 gradients) under `DistributedDataParallel(model, bucket_cap_mb=25)`, DDP's documented
default written out as many scripts do (written out, it also caps the first bucket: one bucket of
all the gradients, whose all-reduce cannot start before the backward's last gradient). Synthetic
regression data, fixed seeds, gloo. Nothing in it knows ddpviz.

    torchrun --nproc-per-node 2 train_one_bucket.py --steps 50
    ddpviz tune -- torchrun --nproc-per-node 2 train_one_bucket.py
"""

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch-size", type=int, default=32)  # per rank
    ap.add_argument("--width", type=int, default=1024)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        layers += [nn.Linear(args.width, args.width), nn.ReLU()]
    model = nn.Sequential(*layers[:-1])
    ddp = DDP(model, bucket_cap_mb=25)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1 + rank)
    x = torch.randn(args.batch_size, args.width, generator=g)  # (B, width)
    y = torch.randn(args.batch_size, args.width, generator=g)
    for step in range(args.steps):
        t0 = time.perf_counter()
        loss = nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0 and step % 10 == 0:
            print(f"step {step} loss {loss.item():.4f} {(time.perf_counter() - t0) * 1e3:.1f} ms", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
