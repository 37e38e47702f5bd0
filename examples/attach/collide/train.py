"""A DDP script written the way many research repos are (issue 32): its own `engine`, `app`,
`workers`, `models`, `utils` and `config` modules, a helper Python subprocess, DataLoader workers
started by spawn, a GradScaler, and an evaluation pass through the DDP module.

    torchrun --nproc-per-node 2 examples/attach/collide/train.py

TRAIN_REPORT=PATH.json: each rank writes PATH.rankR.json (its steps, losses, samples per step, the
names its sys.modules holds, what the helper and the DataLoader workers imported, the spool's event
files) and PATH.rankR.pt (its final parameters).
"""

import json
import os
import subprocess
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from app import banner
from config import CFG
from engine import evaluate, train_one_epoch
from models import Net
from utils import Points, worker_report
from workers.helper import __file__ as helper_path


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    helper = json.loads(subprocess.run([sys.executable, helper_path], capture_output=True, text=True,
                                       check=True).stdout)
    torch.manual_seed(CFG["seed"])
    ddp = DDP(Net(CFG["width"]))
    opt = torch.optim.SGD(ddp.parameters(), lr=CFG["lr"])
    scaler = torch.amp.GradScaler("cpu", init_scale=CFG["init_scale"])
    data = Points(CFG["samples"], CFG["seed"])
    sampler = torch.utils.data.DistributedSampler(data, num_replicas=world, rank=rank, shuffle=False)
    loader = torch.utils.data.DataLoader(data, batch_size=CFG["batch_per_rank"], sampler=sampler, num_workers=1,
                                         multiprocessing_context="spawn", worker_init_fn=worker_report)
    losses: list[float] = []
    samples = train_one_epoch(ddp, loader, opt, scaler, losses)
    eval_loss = evaluate(ddp, [data[i * 8:(i + 1) * 8] for i in range(CFG["eval_batches"])])
    print(f"{banner(rank)}: {len(losses)} steps, last loss {losses[-1]:.4f}, eval {eval_loss:.4f}", flush=True)
    dist.barrier()  # every rank trained: the spool holds what it will hold
    report = os.environ.get("TRAIN_REPORT")
    if report:
        spool = os.environ.get("DDPVIZ_ATTACH_SPOOL")
        files = sorted(f for f in os.listdir(spool) if f.startswith("events-")) if spool else []
        base = report[:-len(".json")]
        with open(f"{base}.rank{rank}.json", "w") as fh:
            json.dump({"pid": os.getpid(), "steps": len(losses), "losses": losses, "samples": samples,
                       "modules": sorted(sys.modules), "sys_path": sys.path, "helper": helper, "spool_files": files,
                       "scale": scaler.get_scale()}, fh)
        torch.save({n: p.detach().clone() for n, p in ddp.module.named_parameters()}, f"{base}.rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
