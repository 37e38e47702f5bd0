"""A deep, narrow MLP under DDP at several bucket caps, printing its own median step time per cap.

    torchrun --nproc-per-node 2 train_deep_mlp.py --caps 25,0.01   # 1 bucket, then one per layer (48)

One DDP per cap wraps a copy of the same model; they take turns in blocks of `--block` steps
(cap A, cap B, cap A, ...), the first block of each left out (DDP's rebuild, caches). Each rank
prints one JSON line at the end: per cap, `median_step_ms` (its own clock, `time.perf_counter`
around forward, backward and the optimizer step), `median_step_cpu_ms` (the process's CPU time over
the same span, every thread: `time.process_time`, which other processes' load moves less than wall
time) and DDP's bucket count after its rebuild
(`_get_ddp_logging_data()`). Used by the attach bucket-cost bench (`workers/bench/attach_bucket_cost.py`).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--depth", type=int, default=48)  # Linear layers; at 0.01 MB each is its own bucket
    ap.add_argument("--caps", default="25,0.01")  # bucket_cap_mb of each DDP, comma-separated
    ap.add_argument("--blocks", type=int, default=4)  # turns of each cap; the first is left out
    ap.add_argument("--block", type=int, default=24)  # steps per turn
    ap.add_argument("--batch-size", type=int, default=32)  # per rank
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(args.depth):
        layers += [nn.Linear(args.width, args.width), nn.ReLU()]
    model = nn.Sequential(*layers)
    caps = [float(c) for c in args.caps.split(",")]
    ddps = [DDP(copy.deepcopy(model), bucket_cap_mb=cap) for cap in caps]
    opts = [torch.optim.SGD(d.parameters(), lr=1e-3) for d in ddps]
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(args.batch_size, args.width, generator=g)  # (B, width)
    y = torch.randn(args.batch_size, args.width, generator=g)
    times: list[list[float]] = [[] for _ in caps]
    cpu: list[list[float]] = [[] for _ in caps]
    for block in range(args.blocks):
        for i, (ddp, opt) in enumerate(zip(ddps, opts)):
            for _ in range(args.block):
                t0, c0 = time.perf_counter(), time.process_time()
                loss = ((ddp(x) - y) ** 2).mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
                if block > 0:
                    times[i].append(time.perf_counter() - t0)
                    cpu[i].append(time.process_time() - c0)
    rows = []
    for cap, ddp, ts, cs in zip(caps, ddps, times, cpu):
        sizes = str(ddp._get_ddp_logging_data().get("rebuilt_bucket_sizes", ""))
        rows.append(dict(bucket_cap_mb=cap, median_step_ms=statistics.median(ts) * 1e3,
                         median_step_cpu_ms=statistics.median(cs) * 1e3, steps=len(ts),
                         buckets=len([s for s in sizes.split(",") if s.strip()])))
    print(json.dumps(dict(rank=rank, caps=rows)), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
