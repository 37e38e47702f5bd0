"""Independent reference: the same config trained by plain PyTorch DDP, nothing of ddpviz's but the
model, the data and the batch plan.

Two gloo processes wrap `build_model(cfg, ds)` in `DistributedDataParallel` with the config's
`static_graph`, `find_unused_parameters` and `bucket_cap_mb`, PyTorch's default all-reduce or the
PyTorch hook `cfg.comm_hook` names (its all-reduced bytes counted per step), and train with `torch.optim.SGD(lr)` on each rank's `BatchPlan` shard with a plain
`F.cross_entropy` on the model's logits. Rank 0 reports its final parameters,
`_get_ddp_logging_data()`, whether both ranks ended with equal parameters every rank's loss
per step (`losses[rank][step]`), the bytes a hook handed to all-reduce (`wire_bytes[rank][step]`)
and whether the averaged gradients were finite (`grads_finite[rank][step]`).
"""

from __future__ import annotations


import torch
import torch.distributed as dist

# before any process group: imported later (DDP's constructor does, through torch._dynamo) its
# `group=group.WORLD` defaults pin the gloo group past destroy_process_group() into exit (SIGABRT)
import torch.distributed.nn.functional  # noqa: F401,E402
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from ddpviz.engine.config import RunConfig
from ddpviz.engine.data import BatchPlan


def _logits(out):
    if isinstance(out, dict):
        return out["logits"]
    return out[0] if isinstance(out, tuple) else out


_ORIGINAL_ALL_REDUCE = dist.all_reduce


def _register_hook(ddp, cfg) -> list[int]:
    """Register PyTorch's own hook for `cfg.comm_hook` (none: DDP's built-in all-reduce) and count,
    per step, the bytes of the tensors it hands to `dist.all_reduce` (the returned list; the caller
    appends a 0 per step). DDP's built-in all-reduce runs in C++ and is not counted."""
    wire: list[int] = []
    if cfg.comm_hook == "none":
        return wire
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if cfg.comm_hook == "powersgd":
        ddp.register_comm_hook(powerSGD_hook.PowerSGDState(None, matrix_approximation_rank=cfg.matrix_approximation_rank,
                                                           start_powerSGD_iter=cfg.start_powerSGD_iter),
                               powerSGD_hook.powerSGD_hook)
    else:
        ddp.register_comm_hook(None, {"fp16": default_hooks.fp16_compress_hook,
                                      "bf16": default_hooks.bf16_compress_hook}[cfg.comm_hook])

    def counting(tensor, *args, **kwargs):
        wire[-1] += tensor.numel() * tensor.element_size()
        return _ORIGINAL_ALL_REDUCE(tensor, *args, **kwargs)

    dist.all_reduce = counting
    return wire


def _worker(rank, world, port, cfg_dict, out):
    from ref_procs import gloo_model

    cfg, ds, model = gloo_model(rank, world, port, cfg_dict)
    cap = None if cfg.bucket_cap_mb == 25.0 else cfg.bucket_cap_mb
    ddp = DDP(model, static_graph=cfg.static_graph, find_unused_parameters=cfg.find_unused_parameters,
              bucket_cap_mb=cap)
    wire = _register_hook(ddp, cfg)
    opt = torch.optim.SGD(ddp.parameters(), lr=cfg.lr)
    plan = BatchPlan(len(ds), world, cfg.micro_batch_per_device, cfg.seed)
    losses, finite = [], []
    for step in range(cfg.steps):
        idx = plan.rank_indices(step, rank)
        logits = _logits(ddp(ds.x_train[idx]))
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), ds.y_train[idx].reshape(-1))
        wire.append(0)
        loss.backward()
        losses.append(loss.item())
        finite.append(all(bool(torch.isfinite(p.grad.coalesce().values() if p.grad.is_sparse else p.grad).all())
                          for p in model.parameters() if p.grad is not None))
        opt.step()
        opt.zero_grad(set_to_none=True)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    every = [torch.zeros_like(flat) for _ in range(world)]
    dist.all_gather(every, flat)
    dist.all_reduce = _ORIGINAL_ALL_REDUCE
    every_losses, every_wire, every_finite = [None] * world, [None] * world, [None] * world
    dist.all_gather_object(every_losses, losses)
    dist.all_gather_object(every_wire, wire)
    dist.all_gather_object(every_finite, finite)
    if rank == 0:
        out.put(dict(params=flat.tolist(), in_sync=all(torch.equal(every[0], e) for e in every),
                     losses=every_losses, wire_bytes=every_wire, grads_finite=every_finite,
                     logging=dict(ddp._get_ddp_logging_data())))  # plain values: the child exits
    dist.barrier()


def plain_ddp(cfg: RunConfig) -> dict:
    """Train `cfg` (cfg.steps steps, 2 ranks) with plain DDP; rank 0's report (see module doc)."""
    from ref_procs import run_reference

    from ddpviz.engine.modes.launcher import free_port

    assert cfg.world_size == 2 and cfg.grad_accum_steps == 1 and cfg.optimizer == "sgd"
    (report,) = run_reference(_worker, (2, free_port(), cfg.to_json_dict()), nprocs=2, results=1)
    return {**report, "params": torch.tensor(report["params"])}
