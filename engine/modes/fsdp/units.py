"""FSDP units: which sub-modules `fully_shard` wraps, their sizes per rank, and FSDP pre-flight.

Unit policy: every child of every `nn.ModuleList` in the model that holds trainable parameters
becomes its own unit (the GPT's blocks, the MLP's hidden layers, the CNN's convs), and the root
module is the last unit, holding whatever is left (embeddings, heads, final norms). This is the
policy of the FSDP2 examples and torchtitan (`fully_shard` per transformer block, then the
root). A model without such sub-modules runs as one unit, the root, and pre-flight says so.

Sizes: FSDP2 shards each parameter on dim 0 and pads dim 0 up to a multiple of world_size
(`_get_dim0_padded_size` in torch/distributed/fsdp/_fully_shard/_fsdp_common.py), so each rank
holds ceil(d0 / n) rows of every parameter and an all-gather returns n times that.
"""

from __future__ import annotations

import math
from typing import Any

import torch.nn as nn

from ddpviz.engine.components.devices import DevicePlan, PreflightError
from ddpviz.engine.config import RunConfig

ROOT = "root"  # the name of the root unit in events and previews
# Backends whose process groups implement reduce_scatter_tensor and all_gather_into_tensor,
# the two collectives FSDP2 issues (torch.distributed docs, "Backends" table; gloo since 2.x).
REDUCE_SCATTER_BACKENDS = ("gloo", "nccl")
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2}


def unit_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(qualified name, module) of every non-root unit, in the model's module order.

    Children of an `nn.ModuleList` that own trainable parameters; nested lists give nested units,
    which `shard_order` orders inner first as `fully_shard` requires.
    """
    out = []
    for name, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList):
            for i, child in enumerate(mod):
                if any(p.requires_grad for p in child.parameters()):
                    out.append((f"{name}.{i}" if name else str(i), child))
    return out


def shard_order(units: list[tuple[str, nn.Module]]) -> list[tuple[str, nn.Module]]:
    """`units` deepest first: FSDP2 must wrap a sub-module before the module that contains it."""
    return sorted(units, key=lambda u: -u[0].count("."))


def managed_params(model: nn.Module, units: list[tuple[str, nn.Module]]) -> dict[str, list[str]]:
    """Unit name -> qualified names of the parameters it shards (each parameter in the innermost
    unit that contains it, the rest in the root; a tied parameter counted once, where first seen)."""
    prefixes = sorted(((f"{n}.", n) for n, _ in units), key=lambda p: -len(p[0]))
    out: dict[str, list[str]] = {n: [] for n, _ in units}
    out[ROOT] = []
    for pname, p in model.named_parameters():  # named_parameters() yields a tied tensor once
        if not p.requires_grad:
            continue
        owner = next((unit for prefix, unit in prefixes if pname.startswith(prefix)), ROOT)
        out[owner].append(pname)
    return out


def padded_numel(shape: tuple[int, ...], world_size: int) -> int:
    """Elements of a parameter after FSDP2 pads dim 0 to a multiple of world_size."""
    if not shape:
        return world_size  # a 0-d parameter is viewed as (1,) and padded like any other
    rows = math.ceil(shape[0] / world_size) * world_size
    return rows * math.prod(shape[1:])


def unit_layout(model: nn.Module, cfg: RunConfig) -> list[dict[str, Any]]:
    """Per unit (root last) of `model` under `unit_modules`' policy: see `layout_of`."""
    return layout_of(model, unit_modules(model), cfg.world_size, _DTYPE_BYTES[cfg.fsdp_param_dtype],
                     _DTYPE_BYTES[cfg.fsdp_reduce_dtype])


def layout_of(model: nn.Module, units: list[tuple[str, nn.Module]], world_size: int,
              gather_dtype_bytes: int, reduce_dtype_bytes: int) -> list[dict[str, Any]]:
    """Per unit (`units`, the non-root ones, then the root): name, param_names, numel, and the
    bytes FSDP2 will move and hold. Works on the model before or after `fully_shard` (a sharded
    parameter, a DTensor, has the full shape).

    `gather_bytes`: the all-gather output of the unit (all ranks' padded shards) in the
    parameter dtype; `reduce_bytes`: the reduce-scatter input in the reduce dtype;
    `shard_bytes`: one rank's fp32 shard of the unit's parameters (what it keeps between steps).
    """
    params = dict(model.named_parameters())
    managed = managed_params(model, units)
    out = [_unit_entry(name, managed[name], params, world_size, gather_dtype_bytes, reduce_dtype_bytes)
           for name, _ in units]
    out.append(_unit_entry(ROOT, managed[ROOT], params, world_size, gather_dtype_bytes, reduce_dtype_bytes))
    return [u for u in out if u["numel"] > 0]


def _unit_entry(name: str, names: list[str], params: dict, n: int, gather_dtype_bytes: int,
                reduce_dtype_bytes: int) -> dict[str, Any]:
    numel = sum(params[p].numel() for p in names)
    padded = sum(padded_numel(tuple(params[p].shape), n) for p in names)
    return dict(unit=name, param_names=names, numel=numel, padded_numel=padded,
                gather_bytes=padded * gather_dtype_bytes, reduce_bytes=padded * reduce_dtype_bytes,
                shard_bytes=padded // n * 4)


def fsdp_preview(cfg: RunConfig, model: nn.Module) -> dict[str, Any]:
    """`run_started.fsdp_units`: the unit layout, and a note when the model has one unit only."""
    layout = unit_layout(model, cfg)
    note = None
    if len(layout) == 1:
        note = (f"model '{cfg.model}' has no sub-modules to shard (no nn.ModuleList of blocks): "
                f"FSDP runs it as one unit, the root, so each step gathers the whole model at once "
                f"and the transient peak is the full model")
    return dict(units=layout, note=note, reshard_after_forward=cfg.reshard_after_forward,
                param_dtype=cfg.fsdp_param_dtype, reduce_dtype=cfg.fsdp_reduce_dtype)


def check_fsdp(cfg: RunConfig, plan: DevicePlan, model: nn.Module) -> None:
    """Refuse what FSDP2 cannot run here, naming the field.

    Raises:
        PreflightError: the backend lacks reduce-scatter (`backend`); a module produces sparse
            gradients (`model`: FSDP2 reduce-scatters one dense flat buffer per unit, and
            `foreach_reduce` rejects sparse tensors).
    """
    if plan.backend not in REDUCE_SCATTER_BACKENDS:
        raise PreflightError("backend", f"backend '{plan.backend}' has no reduce-scatter, which FSDP "
                                        f"needs for every gradient; use one of {list(REDUCE_SCATTER_BACKENDS)}")
    sparse = [n for n, m in model.named_modules()
              if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.sparse]
    if sparse:
        raise PreflightError("model", f"model '{cfg.model}' has sparse gradients ({', '.join(sparse)}: "
                                      f"sparse=True); FSDP reduce-scatters dense gradients only. "
                                      f"Use sparse=False, or mode 'ddp'")
