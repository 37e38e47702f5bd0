"""The script's own utils module: its dataset and what its DataLoader workers report."""

import json
import os
import sys

import torch


class Points(torch.utils.data.Dataset):
    """`n` fixed points (x: 8 floats, y = sum of x), the same on every rank and run."""

    def __init__(self, n: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 8, generator=g)
        self.y = self.x.sum(dim=1, keepdim=True)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def worker_report(worker_id: int) -> None:
    """In each DataLoader worker: whether ddpviz instrumented it (its session module loaded)."""
    out = os.environ.get("COLLIDE_WORKERS_DIR")
    if out:
        with open(os.path.join(out, f"worker-{os.getpid()}.json"), "w") as fh:
            json.dump({"pid": os.getpid(), "worker_id": worker_id,
                       "ddpviz": sorted(m for m in sys.modules if m.startswith("ddpviz"))}, fh)
