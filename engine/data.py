"""Real datasets and the per-rank batch plan shared by every mode.

- `digits`: the 1,797 8x8 handwritten digits shipped with scikit-learn (offline).
- `text`: character-level English prose from CPython's `pydoc_data.topics`.
- `synthetic`: seeded random tensors, for scaling a model without caring about accuracy.

`BatchPlan` decides which samples each rank sees at each micro-step using PyTorch's own
`DistributedSampler` (shuffle, seed, drop_last=True). DDP ranks use their own shard; single and DP
use the concatenation of all ranks' shards in rank order, so DP's scatter hands device r exactly
what DDP rank r loads, and all three modes train on the same global batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch
from torch.utils.data.distributed import DistributedSampler

from ddpviz.engine.config import RunConfig

VAL_FRACTION = 0.15  # share of samples held out for validation
SYNTHETIC_SAMPLES = 4096
SYNTHETIC_FEATURES = 64
SYNTHETIC_CLASSES = 10


@dataclass
class Dataset:
    """Train/validation tensors. x: (N, in_dim) float or (N, T) long; y: (N,) or (N, T) long."""

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_val: torch.Tensor
    y_val: torch.Tensor
    in_dim: int
    n_classes: int  # classes, or vocabulary size for text

    def __len__(self) -> int:
        return len(self.x_train)


def _split(x: torch.Tensor, y: torch.Tensor, seed: int):
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(x), generator=g)
    n_val = int(len(x) * VAL_FRACTION)
    val, train = perm[:n_val], perm[n_val:]
    return x[train], y[train], x[val], y[val]


@lru_cache(maxsize=1)
def _digits_arrays():
    """The 1,797 8x8 digits scikit-learn ships, read from its own file as `load_digits` reads it
    (datasets/data/digits.csv.gz: 64 pixel columns 0-16, then the label), without importing
    scikit-learn: its import (scipy and all) costs ~2 s of every rank process's start here."""
    import importlib.util

    import numpy as np

    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("dataset digits: scikit-learn is not installed (pip install scikit-learn)")
    path = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"
    d = np.loadtxt(path, delimiter=",", dtype=np.float64)  # (1797, 65)
    x = torch.tensor(d[:, :-1], dtype=torch.float32) / 16.0  # (1797, 64) in [0, 1]
    return x, torch.tensor(d[:, -1], dtype=torch.long)


@lru_cache(maxsize=1)
def _prose() -> str:
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))


def _text(block_size: int, seed: int) -> Dataset:
    text = _prose()
    vocab = sorted(set(text))
    stoi = {c: i for i, c in enumerate(vocab)}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    stride = max(1, block_size // 2)
    starts = torch.arange(0, len(data) - block_size - 1, stride)
    idx = starts[:, None] + torch.arange(block_size + 1)[None, :]  # (N, T+1)
    windows = data[idx]
    # Hold out the tail of the corpus (not random windows) so validation text is unseen.
    n_val = int(len(windows) * VAL_FRACTION)
    tr, va = windows[:-n_val], windows[-n_val:]
    return Dataset("text", tr[:, :-1], tr[:, 1:], va[:, :-1], va[:, 1:], block_size, len(vocab))


def load_dataset(cfg: RunConfig) -> Dataset:
    """Load `cfg.dataset` (or a plugin model's own data), split train/validation."""
    if cfg.model not in ("mlp", "cnn", "gpt"):
        from ddpviz.engine.plugins import load_plugin

        return load_plugin(cfg.model).dataset(cfg)
    if cfg.dataset == "digits":
        x, y = _digits_arrays()
        return Dataset("digits", *_split(x, y, 0), in_dim=64, n_classes=10)
    if cfg.dataset == "text":
        return _text(cfg.block_size, cfg.seed)
    g = torch.Generator().manual_seed(1234)  # fixed: the data does not change with the run seed
    if cfg.model == "gpt":
        vocab = 64
        x = torch.randint(0, vocab, (SYNTHETIC_SAMPLES, cfg.block_size + 1), generator=g)
        n_val = int(SYNTHETIC_SAMPLES * VAL_FRACTION)
        return Dataset("synthetic", x[n_val:, :-1], x[n_val:, 1:], x[:n_val, :-1], x[:n_val, 1:],
                       cfg.block_size, vocab)
    x = torch.randn(SYNTHETIC_SAMPLES, SYNTHETIC_FEATURES, generator=g)
    y = torch.randint(0, SYNTHETIC_CLASSES, (SYNTHETIC_SAMPLES,), generator=g)
    return Dataset("synthetic", *_split(x, y, 0), in_dim=SYNTHETIC_FEATURES, n_classes=SYNTHETIC_CLASSES)


class BatchPlanError(ValueError):
    """The dataset cannot give every rank a micro-batch; `field` names the RunConfig field to change
    (`world_size` when the ranks outnumber the training samples, else `global_batch_size`)."""

    def __init__(self, field_name: str, message: str):
        self.field = field_name
        super().__init__(message)


class BatchPlan:
    """Which training samples rank `r` uses at micro-step `m`, via `DistributedSampler`.

    Args:
        n_samples: training set size.
        world_size: ranks (DDP) or devices (DP) the global batch is split over.
        micro_batch: samples per rank per micro-step (global_batch / world_size / grad_accum_steps).
        seed: shuffling seed (DistributedSampler's `seed`; the epoch is set with `set_epoch`).

    Policy for a dataset that does not divide evenly: `drop_last=True` on the sampler and on the
    batches, so every rank runs the same number of steps and no collective waits for a missing rank.

    Raises:
        BatchPlanError: a rank would get no full micro-batch. Field `world_size` when there are
            fewer training samples than ranks (no global_batch_size can help: `DistributedSampler`
            with drop_last gives each rank len(dataset) // world_size = 0 samples), else
            `global_batch_size`.
    """

    def __init__(self, n_samples: int, world_size: int, micro_batch: int, seed: int):
        self.n_samples, self.world_size, self.micro_batch, self.seed = n_samples, world_size, micro_batch, seed
        self.per_rank = n_samples // world_size  # DistributedSampler(drop_last=True) shard size
        self.batches_per_epoch = self.per_rank // micro_batch
        if self.per_rank < 1:
            raise BatchPlanError("world_size", f"world_size ({world_size}) is larger than the dataset's "
                                 f"{n_samples} training samples: DistributedSampler (drop_last) gives each "
                                 f"rank len(dataset) // world_size = 0 samples; use world_size <= {n_samples} "
                                 f"or more training samples")
        if self.batches_per_epoch < 1:
            raise BatchPlanError("global_batch_size", f"global_batch_size is too large for the dataset: each rank gets "
                             f"{self.per_rank} training samples but needs {micro_batch} per micro-step")
        self._cache: dict[tuple[int, int], list[int]] = {}

    def sampler(self, rank: int, epoch: int) -> DistributedSampler:
        s = DistributedSampler(range(self.n_samples), num_replicas=self.world_size, rank=rank,
                               shuffle=True, seed=self.seed, drop_last=True)
        s.set_epoch(epoch)
        return s

    def _epoch_indices(self, rank: int, epoch: int) -> list[int]:
        key = (rank, epoch)
        if key not in self._cache:
            if len(self._cache) > 4 * self.world_size:
                self._cache.clear()
            self._cache[key] = list(iter(self.sampler(rank, epoch)))
        return self._cache[key]

    def rank_indices(self, micro_step: int, rank: int) -> torch.Tensor:
        """Indices (micro_batch,) that `rank` trains on at global micro-step `micro_step`."""
        epoch, j = divmod(micro_step, self.batches_per_epoch)
        idx = self._epoch_indices(rank, epoch)[j * self.micro_batch:(j + 1) * self.micro_batch]
        return torch.tensor(idx, dtype=torch.long)

    def global_indices(self, micro_step: int) -> torch.Tensor:
        """All ranks' indices in rank order (world_size * micro_batch,): the global micro-batch."""
        return torch.cat([self.rank_indices(micro_step, r) for r in range(self.world_size)])
