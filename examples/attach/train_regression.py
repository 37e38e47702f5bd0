"""A DDP training script written the usual way: a DataLoader over a dataset, a regression loss
(MSE), gradient accumulation with `no_sync()`. Nothing in it knows ddpviz.

    torchrun --nproc-per-node 2 train_regression.py --epochs 2 --accum 2
    torchrun --nproc-per-node 1 train_regression.py --device cuda   # NCCL, one GPU a rank

`--profile` runs PyTorch's profiler over the first optimizer steps, as research code does (a schedule:
warm-up 2 steps, record 2), and reports how many events its trace held.

With TRAIN_REPORT=FILE.json in the environment it also writes, at the end, what it counted
itself (optimizer steps, micro-steps, the loss of each step), DDP's own logging data, and
saves its final parameters to FILE.json's sibling `.pt` (for checking a run against another).
"""

import argparse
import contextlib
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, schedule
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def make_data(n: int = 1024, features: int = 32) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, features, generator=g)
    w = torch.randn(features, 1, generator=g)
    y = x @ w + 0.1 * torch.randn(n, 1, generator=g)  # a noisy linear target
    return TensorDataset(x, y)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)  # per rank, per micro-step
    ap.add_argument("--accum", type=int, default=2)  # micro-steps per optimizer step
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--bucket-cap-mb", type=float, default=0.25)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")  # cuda: one GPU a rank, NCCL
    args = ap.parse_args()

    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1234)
    model = nn.Sequential(nn.Linear(32, args.hidden), nn.ReLU(), nn.Linear(args.hidden, args.hidden),
                          nn.ReLU(), nn.Linear(args.hidden, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 1))
    model = model.to(device)
    ddp = DDP(model, bucket_cap_mb=args.bucket_cap_mb, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.AdamW(ddp.parameters(), lr=args.lr)
    loss_fn = nn.MSELoss()
    ds = make_data()
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=args.batch_size, sampler=sampler, drop_last=True)

    steps = micro_steps = 0
    losses, traced = [], []
    prof = contextlib.nullcontext()
    if args.profile:
        prof = profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=2, active=2),
                       on_trace_ready=lambda p: traced.append(len(p.events())))
        prof.__enter__()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        step_loss = 0.0
        for i, (x, y) in enumerate(loader):
            t0 = time.perf_counter()
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            last = (i + 1) % args.accum == 0
            if last:
                loss = loss_fn(ddp(x), y) / args.accum
                loss.backward()
            else:
                with ddp.no_sync():  # accumulate locally; all-reduce on the last micro-step only
                    loss = loss_fn(ddp(x), y) / args.accum
                    loss.backward()
            micro_steps += 1
            step_loss += loss.item()
            if last:
                opt.step()
                opt.zero_grad()
                steps += 1
                losses.append(step_loss)
                if args.profile:
                    prof.step()
                if rank == 0 and steps % 5 == 0:
                    print(f"epoch {epoch} step {steps} loss {step_loss:.4f} "
                          f"{(time.perf_counter() - t0) * 1e3:.1f} ms", flush=True)
                step_loss = 0.0

    prof.__exit__(None, None, None)
    report = os.environ.get("TRAIN_REPORT")
    if report:
        path = report.replace(".json", f".rank{rank}.json")
        with open(path, "w") as fh:
            json.dump(dict(rank=rank, steps=steps, micro_steps=micro_steps, losses=losses,
                           ddp_logging={k: v for k, v in ddp._get_ddp_logging_data().items()
                                        if isinstance(v, (int, str, float))},
                           param_names=[n for n, _ in model.named_parameters()],
                           comm_hooks=len(getattr(ddp, "_comm_hooks", [])),  # Python hooks DDP holds
                           profiled_events=traced), fh)
        torch.save({n: p.detach().clone() for n, p in model.named_parameters()},
                   path.replace(".json", ".pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
