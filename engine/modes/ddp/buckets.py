"""Bucket layout preview: which parameters land in which DDP bucket, before anything launches.

Uses PyTorch's own assignment rule for the installed version, `dist._compute_bucket_assignment_by_size`,
with the limits `DistributedDataParallel.__init__` picks (`_BucketCapacityConfig`,
torch/nn/parallel/distributed.py):

- step 0: unless `find_unused_parameters` (and not `static_graph`), every parameter goes into ONE
  bucket (limit `sys.maxsize`), in reverse registration order;
- after step 0 the Reducer rebuilds the buckets in the order gradients became ready, with limits
  [first_bucket_bytes_cap, bucket_bytes_cap]; the first cap is 1 MiB
  (`dist._DEFAULT_FIRST_BUCKET_BYTES`) only when `bucket_cap_mb` is left at DDP's default.

The gradient-ready order is measured with one probe backward (post-accumulate-grad hooks) on a
real micro-batch (`engine.components.preflight.probe_batch`); parameters that get no gradient come last, in
registration order, as the Reducer appends them (static_graph or find_unused_parameters).

Sparse gradients (`nn.Embedding`/`nn.EmbeddingBag` with `sparse=True`) never share a bucket: DDP
passes `expect_sparse_gradient` to the assignment rule, which gives each its own
(`compute_bucket_assignment_by_size`, torch/csrc/distributed/c10d/reducer.cpp). Such a bucket
sends the sparse gradient itself, values and indices (`Reducer::mark_variable_ready_sparse`), so
its `nbytes` here is those bytes on the probe batch, not the parameter's dense size.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from ddpviz.engine.components.training import loss_fn
from ddpviz.engine.config import RunConfig
from ddpviz.engine.modes.ddp.comm_hook import wire_nbytes

DDP_DEFAULT_BUCKET_CAP_MB = 25.0  # torch.nn.parallel.distributed._DEFAULT_BUCKET_CAP_MB
MIB = 1024 * 1024


def ddp_bucket_cap_arg(cfg: RunConfig) -> float | None:
    """What to pass as DDP's `bucket_cap_mb`: None at the default, so DDP keeps its 1 MiB first bucket."""
    return None if cfg.bucket_cap_mb == DDP_DEFAULT_BUCKET_CAP_MB else cfg.bucket_cap_mb


def buffer_sync_arg(broadcast_buffers: bool) -> dict[str, bool]:
    """DDP's keyword for `RunConfig.broadcast_buffers` (rank 0's buffers to every rank before each forward):
    nothing at True (every torch's default); at False `forward_sync_buffers=False` where DDP has it (torch 2.13
    renamed `broadcast_buffers`, and warns "`broadcast_buffers` is deprecated" (FutureWarning) on every rank given
    it, True or False), else `broadcast_buffers=False`. The new name still syncs the buffers once at
    construction, the old one did not (torch/nn/parallel/distributed.py): a launched rank's model is built from
    `cfg.seed` on every rank, so its buffers are equal then and that sync changes nothing."""
    import inspect

    if broadcast_buffers:
        return {}
    from torch.nn.parallel import DistributedDataParallel as DDP

    new = "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters
    return {"forward_sync_buffers" if new else "broadcast_buffers": False}


def cap_mb_of(bucket_bytes_cap: int) -> float:
    """The `bucket_cap_mb` a DDP was given, from its `bucket_bytes_cap` (``int(bucket_cap_mb * 1024 * 1024)``,
    torch/nn/parallel/distributed.py): the shortest decimal (up to 9 places) that gives the same bytes, so a
    script's 0.02 reads 0.02, not 0.01999950408935547 (a new user, 2026-12-06)."""
    for places in range(10):
        mb = round(bucket_bytes_cap / MIB, places)
        if int(mb * MIB) == bucket_bytes_cap:
            return mb
    return bucket_bytes_cap / MIB


def caps_bytes(cfg: RunConfig) -> tuple[int, int]:
    """(first_bucket_bytes_cap, bucket_bytes_cap) as DDP computes them."""
    cap = int(cfg.bucket_cap_mb * MIB)
    first = dist._DEFAULT_FIRST_BUCKET_BYTES if ddp_bucket_cap_arg(cfg) is None else cap
    return first, cap


def expect_sparse_gradient(model: nn.Module) -> list[bool]:
    """Per trainable parameter (registration order, shared ones once): whether DDP expects a
    sparse gradient for it — its first owning module is an Embedding/EmbeddingBag with
    `sparse=True` (`DistributedDataParallel._build_params_for_reducer`)."""
    seen: set[int] = set()
    out = []
    for module in model.modules():
        for p in module.parameters(recurse=False):
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                out.append(isinstance(module, (nn.Embedding, nn.EmbeddingBag)) and bool(module.sparse))
    return out


def probe_gradients(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[list[int], dict[int, int]]:
    """One probe backward on (x, y): trainable-parameter indices in the order their gradients
    were accumulated (unused ones last, in registration order), and `wire_nbytes` of each
    sparse gradient by index. The model is left as found (`engine.components.preflight.probing`)."""
    from ddpviz.engine.components.preflight import probing

    params = [p for p in model.parameters() if p.requires_grad]
    order: list[int] = []
    handles = [p.register_post_accumulate_grad_hook(lambda _p, i=i: order.append(i)) for i, p in enumerate(params)]
    try:
        with probing(model):
            loss_fn(model(x), y).backward()
            sparse = {i: wire_nbytes(p.grad) for i, p in enumerate(params)
                      if p.grad is not None and p.grad.is_sparse}
    finally:
        for h in handles:
            h.remove()
    seen = list(dict.fromkeys(order))
    return seen + [i for i in range(len(params)) if i not in seen], sparse


def grad_ready_order(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[int]:
    """Indices (into the trainable parameters) in the order their gradients are accumulated."""
    return probe_gradients(model, x, y)[0]


def _describe(buckets: list[list[int]], named: list[tuple[str, torch.Tensor]],
              sparse: dict[int, int]) -> list[dict[str, Any]]:
    out = []
    for b, idx in enumerate(buckets):
        ps = [named[i] for i in idx]
        nbytes = sum(sparse[i] if i in sparse else p.numel() * p.element_size() for i, (_, p) in zip(idx, ps))
        out.append(dict(bucket_index=b, nbytes=nbytes, num_params=len(ps), param_names=[n for n, _ in ps],
                        sparse=any(i in sparse for i in idx)))
    return out


def preview_buckets(cfg: RunConfig, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
    """Bucket layout of step 0 and after the rebuild, in DDP's bucket-index order.

    Args:
        cfg: the run config (bucket_cap_mb, static_graph, find_unused_parameters matter).
        model: the model, as built for the run (not wrapped).
        x, y: a probe micro-batch (`engine.components.preflight.probe_batch`), to measure the
            gradient-ready order and the bytes of sparse gradients.

    Returns:
        ``{"initial": [...], "rebuilt": [...], "first_bucket_cap_bytes", "bucket_cap_bytes"}``,
        each bucket ``{bucket_index, nbytes, num_params, param_names, sparse}`` (`sparse`: the
        bucket holds one sparse gradient; `nbytes` is then its values and indices).
    """
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    tensors = [p for _, p in named]
    is_sparse = expect_sparse_gradient(model)
    first, cap = caps_bytes(cfg)
    if cfg.static_graph or not cfg.find_unused_parameters:
        limits = [sys.maxsize]
    else:
        limits = [first, cap] if first < cap else [cap]
    initial, _ = dist._compute_bucket_assignment_by_size(tensors, limits, is_sparse)
    order, sparse = probe_gradients(model, x, y)
    # the flags stay in registration order: the rule reads them by original index (tensor_indices)
    rebuilt, _ = dist._compute_bucket_assignment_by_size([tensors[i] for i in order], [first, cap],
                                                         is_sparse, order)
    return dict(initial=_describe(list(reversed(initial)), named, sparse),
                rebuilt=_describe(rebuilt, named, sparse), first_bucket_cap_bytes=first, bucket_cap_bytes=cap)
