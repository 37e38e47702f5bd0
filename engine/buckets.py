"""Bucket layout preview: which parameters land in which DDP bucket, before anything launches.

Uses PyTorch's own assignment rule for the installed version, `dist._compute_bucket_assignment_by_size`,
with the limits `DistributedDataParallel.__init__` picks (`_BucketCapacityConfig`,
torch/nn/parallel/distributed.py):

- step 0: unless `find_unused_parameters` (and not `static_graph`), every parameter goes into ONE
  bucket (limit `sys.maxsize`), in reverse registration order;
- after step 0 the Reducer rebuilds the buckets in the order gradients became ready, with limits
  [first_bucket_bytes_cap, bucket_bytes_cap]; the first cap is 1 MiB
  (`dist._DEFAULT_FIRST_BUCKET_BYTES`) only when `bucket_cap_mb` is left at DDP's default.

The gradient-ready order is measured with one probe backward (post-accumulate-grad hooks).
"""

from __future__ import annotations

import sys
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from engine.config import RunConfig
from engine.training import loss_fn

DDP_DEFAULT_BUCKET_CAP_MB = 25.0  # torch.nn.parallel.distributed._DEFAULT_BUCKET_CAP_MB
MIB = 1024 * 1024


def ddp_bucket_cap_arg(cfg: RunConfig) -> float | None:
    """What to pass as DDP's `bucket_cap_mb`: None at the default, so DDP keeps its 1 MiB first bucket."""
    return None if cfg.bucket_cap_mb == DDP_DEFAULT_BUCKET_CAP_MB else cfg.bucket_cap_mb


def caps_bytes(cfg: RunConfig) -> tuple[int, int]:
    """(first_bucket_bytes_cap, bucket_bytes_cap) as DDP computes them."""
    cap = int(cfg.bucket_cap_mb * MIB)
    first = dist._DEFAULT_FIRST_BUCKET_BYTES if ddp_bucket_cap_arg(cfg) is None else cap
    return first, cap


def grad_ready_order(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[int]:
    """Indices (into the trainable parameters) in the order their gradients are accumulated."""
    params = [p for p in model.parameters() if p.requires_grad]
    order: list[int] = []
    handles = [p.register_post_accumulate_grad_hook(lambda _p, i=i: order.append(i)) for i, p in enumerate(params)]
    try:
        model.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
    finally:
        for h in handles:
            h.remove()
        model.zero_grad(set_to_none=True)
    seen = list(dict.fromkeys(order))
    return seen + [i for i in range(len(params)) if i not in seen]  # unused last


def _describe(buckets: list[list[int]], named: list[tuple[str, torch.Tensor]]) -> list[dict[str, Any]]:
    out = []
    for b, idx in enumerate(buckets):
        ps = [named[i] for i in idx]
        out.append(dict(bucket_index=b, nbytes=sum(p.numel() * p.element_size() for _, p in ps),
                        num_params=len(ps), param_names=[n for n, _ in ps]))
    return out


def preview_buckets(cfg: RunConfig, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
    """Bucket layout of step 0 and after the rebuild, in DDP's bucket-index order.

    Args:
        cfg: the run config (bucket_cap_mb, static_graph, find_unused_parameters matter).
        model: the model, as built for the run (not wrapped).
        x, y: a probe micro-batch, to measure the gradient-ready order.

    Returns:
        ``{"initial": [...], "rebuilt": [...], "first_bucket_cap_bytes", "bucket_cap_bytes"}``,
        each bucket ``{bucket_index, nbytes, num_params, param_names}``.
    """
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    tensors = [p for _, p in named]
    first, cap = caps_bytes(cfg)
    if cfg.static_graph or not cfg.find_unused_parameters:
        limits = [sys.maxsize]
    else:
        limits = [first, cap] if first < cap else [cap]
    initial, _ = dist._compute_bucket_assignment_by_size(tensors, limits, [False] * len(tensors))
    order = grad_ready_order(model, x, y)
    rebuilt, _ = dist._compute_bucket_assignment_by_size([tensors[i] for i in order], [first, cap],
                                                         [False] * len(tensors), order)
    return dict(initial=_describe(list(reversed(initial)), named), rebuilt=_describe(rebuilt, named),
                first_bucket_cap_bytes=first, bucket_cap_bytes=cap)
