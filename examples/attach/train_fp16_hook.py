"""DDP with the user's own communication hook: gradients compressed to fp16 for the all-reduce
(PyTorch's `fp16_compress_hook`). Nothing in it knows ddpviz.

    torchrun --nproc-per-node 2 train_fp16_hook.py --steps 20

With TRAIN_REPORT=FILE.json it writes what it counted itself, DDP's logging data, and its final
parameters (FILE.rank{R}.json / .pt), like train_regression.py.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--bucket-cap-mb", type=float, default=0.1)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.Tanh(), nn.Linear(128, 128), nn.Tanh(), nn.Linear(128, 8))
    ddp = DDP(model, bucket_cap_mb=args.bucket_cap_mb)
    ddp.register_comm_hook(dist.group.WORLD, default_hooks.fp16_compress_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    steps = 0
    for _ in range(args.steps):
        x = torch.randn(args.batch_size, 64, generator=g)
        y = torch.randn(args.batch_size, 8, generator=g)
        loss = nn.functional.smooth_l1_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps += 1

    report = os.environ.get("TRAIN_REPORT")
    if report:
        path = report.replace(".json", f".rank{rank}.json")
        with open(path, "w") as fh:
            json.dump(dict(rank=rank, steps=steps, micro_steps=steps,
                           ddp_logging={k: v for k, v in ddp._get_ddp_logging_data().items()
                                        if isinstance(v, (int, str, float))},
                           param_names=[n for n, _ in model.named_parameters()]), fh)
        torch.save({n: p.detach().clone() for n, p in model.named_parameters()}, path.replace(".json", ".pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
