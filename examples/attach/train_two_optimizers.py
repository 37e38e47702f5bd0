"""Alternating updates with two optimizers (as a GAN or an actor-critic trains): each iteration
runs two forward/backward passes over its batch on one DDP model, the first stepping the encoder
(SGD), the second the head (AdamW). Two optimizer steps per iteration, so it tells ddpviz where its
steps end with `ddpviz.step()`; without `ddpviz run` those calls do nothing.

    torchrun --nproc-per-node 2 train_two_optimizers.py --steps 8
    ddpviz run -- torchrun --nproc-per-node 2 train_two_optimizers.py --steps 8

With TRAIN_REPORT=FILE.json in the environment it also writes, at the end, what it counted itself
(iterations, the samples and the second pass's loss of each) and saves its final parameters to
FILE.json's sibling `.pt`.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import ddpviz


def make_data(n: int = 512, features: int = 16) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, features, generator=g)
    y = torch.sin(x[:, :1] * 2) + 0.05 * torch.randn(n, 1, generator=g)  # a noisy nonlinear target
    return TensorDataset(x, y)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=24)  # per rank
    ap.add_argument("--hidden", type=int, default=64)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1234)
    encoder = nn.Sequential(nn.Linear(16, args.hidden), nn.Tanh(), nn.Linear(args.hidden, args.hidden), nn.Tanh())
    head = nn.Linear(args.hidden, 1)
    model = DDP(nn.Sequential(encoder, head))
    opt_encoder = torch.optim.SGD(encoder.parameters(), lr=0.05, momentum=0.9)
    opt_head = torch.optim.AdamW(head.parameters(), lr=1e-2)
    ds = make_data()
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=args.batch_size, sampler=sampler, drop_last=True)

    steps, samples, losses = 0, [], []
    with ddpviz.watch(model, [opt_encoder, opt_head], name="two optimizers", steps="explicit"):
        epoch = 0
        while steps < args.steps:
            sampler.set_epoch(epoch)
            for x, y in loader:
                for opt in (opt_encoder, opt_head):  # one pass per optimizer; each steps its own part
                    loss = nn.functional.mse_loss(model(x), y)
                    loss.backward()
                    opt.step()
                    opt_encoder.zero_grad()
                    opt_head.zero_grad()
                ddpviz.step(samples=len(x), loss=loss)
                steps += 1
                samples.append(len(x))
                losses.append(loss.item())
                if rank == 0:
                    print(f"step {steps} loss {loss.item():.4f}", flush=True)
                if steps == args.steps:
                    break
            epoch += 1

    report = os.environ.get("TRAIN_REPORT")
    if report:
        path = report.replace(".json", f".rank{rank}.json")
        with open(path, "w") as fh:
            json.dump(dict(rank=rank, world_size=world, steps=steps, samples=samples, losses=losses), fh)
        torch.save({n: p.detach().clone() for n, p in model.module.named_parameters()},
                   path.replace(".json", ".pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
