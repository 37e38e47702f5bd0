"""An FSDP2 training script written the usual way: a DataLoader over a dataset, a regression loss
(Huber), `fully_shard` on each block and then on the root (the FSDP2 tutorial's and torchtitan's
pattern). Nothing in it knows ddpviz.

    torchrun --nproc-per-node 2 train_fsdp2.py --steps 8

Runs on CPU with gloo (FSDP2 needs all-gather and reduce-scatter, which gloo has), or on CUDA
with NCCL when each rank has a GPU.

`--own-all-gather` gives the first block an all-gather of the script's own (FSDP2's
`set_custom_all_gather`, as a user would to control its memory or its collective), which counts
its calls per step.

With TRAIN_REPORT=FILE.json in the environment it also writes, at the end, what it counted
itself (optimizer steps, the loss of each step), each FSDP unit's parameter names and bytes
(numel x element size, read before sharding), and saves its final full parameters to FILE.json's
sibling `.pt` (for checking a run against another).
"""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 2 * width)
        self.fc2 = nn.Linear(2 * width, width)

    def forward(self, x):  # (B, width) -> (B, width)
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


class Regressor(nn.Module):
    def __init__(self, features: int, width: int, depth: int):
        super().__init__()
        self.inp = nn.Linear(features, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 2)  # two targets

    def forward(self, x):  # (B, features) -> (B, 2)
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


class CountingAllGather(AllGather):
    """The plain all-gather FSDP2 would do (`all_gather_into_tensor`), counting its calls."""

    def __init__(self):
        self.calls = 0

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        self.calls += 1
        return dist.all_gather_single(output_tensor, input_tensor, group=group, async_op=async_op)


def make_data(n: int = 512, features: int = 16) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, features, generator=g)
    y = torch.stack([x[:, :4].sum(1), torch.sin(x[:, 4])], 1) + 0.05 * torch.randn(n, 2, generator=g)
    return TensorDataset(x, y)


def unit_bytes(model: Regressor) -> dict[str, dict]:
    """Each FSDP unit's parameters and their bytes (before sharding): a block each, the root the rest."""
    units = {f"blocks.{i}": dict(params=[f"blocks.{i}.{n}" for n, _ in b.named_parameters()],
                                 nbytes=sum(p.numel() * p.element_size() for p in b.parameters()))
             for i, b in enumerate(model.blocks)}
    rest = [(n, p) for n, p in model.named_parameters() if not n.startswith("blocks.")]
    units["root"] = dict(params=[n for n, _ in rest], nbytes=sum(p.numel() * p.element_size() for _, p in rest))
    return units


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=16)  # per rank
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--own-all-gather", action="store_true", help="the first block all-gathers with CountingAllGather")
    args = ap.parse_args()

    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(1234)
    model = Regressor(16, args.width, args.depth).to(device)
    units = unit_bytes(model)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    own = CountingAllGather() if args.own_all_gather else None
    if own is not None:
        model.blocks[0].set_custom_all_gather(own)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loss_fn = nn.HuberLoss()
    ds = make_data()
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=args.batch_size, sampler=sampler, drop_last=True)

    steps, losses, epoch, own_calls = 0, [], 0, []
    while steps < args.steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            t0 = time.perf_counter()
            x, y = x.to(device), y.to(device)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            steps += 1
            losses.append(loss.item())
            if own is not None:
                own_calls.append(own.calls - sum(own_calls))  # the first block's all-gathers in this step
            if rank == 0 and steps % 5 == 0:
                print(f"step {steps} loss {losses[-1]:.4f} {(time.perf_counter() - t0) * 1e3:.1f} ms", flush=True)
            if steps == args.steps:
                break
        epoch += 1

    full = {n: p.full_tensor().detach().cpu().clone() for n, p in model.named_parameters()}  # a collective
    report = os.environ.get("TRAIN_REPORT")
    if report:
        path = report.replace(".json", f".rank{rank}.json")
        with open(path, "w") as fh:
            json.dump(dict(rank=rank, steps=steps, losses=losses, units=units, world_size=world,
                           own_all_gather_calls=own_calls), fh)
        torch.save(full, path.replace(".json", ".pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
