"""Models the memory, bytes and buffer tests need, registered as `ddpviz.models` plugins.

`installed(root)` writes a `*.dist-info` with `entry_points.txt` under `root` (what `pip install`
writes), so DDP's rank processes, which build the model by name, find them too.

- `widelogits`: Linear(64, 64) -> ReLU -> Linear(64, 20,000): logits far wider than the
  parameters of the body, so the gathered outputs and their gradient on DP's device 0 weigh.
- `bnmlp`: Linear(64, 32) -> BatchNorm1d(32) -> ReLU -> Linear(32, 10): running statistics
  are buffers DDP broadcasts from rank 0 before each forward (`broadcast_buffers=True`).
- `frozen`: Linear(64, 32) frozen (requires_grad False) -> Linear(32, 10): DDP all-reduces only
  the trainable gradients, while "P = parameter bytes" counts the frozen layer too.
- `counting`: Linear(64, 10) with a buffer `calls` that its training forward rebinds
  (`self.calls = self.calls + 1`), as in a field report against DataParallel; `Counting(True)`
  adds in place instead (`self.calls.add_(1)`).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn

from ddpviz.engine.data import Dataset, load_dataset
from ddpviz.engine.plugins import ModelPlugin

WIDE_CLASSES = 20_000


class WideLogits(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(64, 64)
        self.head = nn.Linear(64, WIDE_CLASSES)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))  # (B, 20000)


def wide_dataset(cfg) -> Dataset:
    """The digits' 64 features, labels spread over 20,000 classes (seeded)."""
    ds = load_dataset(cfg.model_copy(update={"model": "mlp", "dataset": "digits"}))
    g = torch.Generator().manual_seed(0)
    return Dataset("digits (20,000 labels)", ds.x_train, torch.randint(0, WIDE_CLASSES, ds.y_train.shape, generator=g),
                   ds.x_val, torch.randint(0, WIDE_CLASSES, ds.y_val.shape, generator=g),
                   ds.in_dim, WIDE_CLASSES)


class BNMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(64, 32)
        self.bn = nn.BatchNorm1d(32)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        return self.head(torch.relu(self.bn(self.body(x))))


class Counting(nn.Module):
    def __init__(self, in_place: bool = False):
        super().__init__()
        self.in_place = in_place
        self.lin = nn.Linear(64, 10)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        if self.training:
            if self.in_place:
                self.calls.add_(1)  # writes the tensor device 0's replica shares with the module
            else:
                self.calls = self.calls + 1  # rebinds the replica's buffer: lost with the replica
        return self.lin(x)


class Frozen(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(64, 32).requires_grad_(False)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


def _digits(cfg):
    return load_dataset(cfg.model_copy(update={"model": "mlp", "dataset": "digits"}))


widelogits = ModelPlugin(build=lambda cfg: WideLogits(), dataset=wide_dataset, description="64 -> 20,000 logits")
bnmlp = ModelPlugin(build=lambda cfg: BNMLP(), dataset=_digits, description="MLP with BatchNorm")
frozen = ModelPlugin(build=lambda cfg: Frozen(), dataset=_digits, description="a frozen body")
counting = ModelPlugin(build=lambda cfg: Counting(), dataset=_digits, description="rebinds a buffer")


def installed(root: Path) -> Path:
    """Register the three plugins under `root` (put `root` and this folder on sys.path)."""
    dist = root / "ddpviz_memory_models-0.1.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ddpviz-memory-models\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[ddpviz.models]\nwidelogits = memory_models:widelogits\nbnmlp = memory_models:bnmlp\n"
        "counting = memory_models:counting\nfrozen = memory_models:frozen\n")
    return root
