"""`mode=fsdp`: the code each rank process runs (started by `engine.modes.launcher` like DDP's ranks).

Every rank builds the same model from the same seed, then FSDP2 (`torch.distributed.fsdp.
fully_shard`) shards it: one unit per block (`engine.modes.fsdp.units`), then the root. Each rank keeps
1/n of every parameter, its gradient and its optimizer state. Before a unit's forward FSDP2
all-gathers the unit's parameters; after it (with `reshard_after_forward`) frees them again and
all-gathers them once more for backward; after a unit's backward it reduce-scatters the
gradients so each rank receives the average of its own shard (Rajbhandari et al. 2020, ZeRO-3;
PyTorch FSDP2 docs). The root keeps FSDP2's default: not resharded after forward.

Data, loss and optimizer are DDP's (`BatchPlan` shards via `DistributedSampler`), so after k
SGD steps the gathered parameters equal `mode=single`'s. Events: `step` (the split counts time
inside collectives as exposed comm: on CPU every FSDP2 collective blocks the training thread),
`fsdp_collective` and `comm_volume` on sampled steps (`engine.modes.fsdp.collectives`), `memory`
(the live-tensor ledger over the whole step) and `fsdp_memory_curve` on traced steps
(`engine.modes.fsdp.memory`), `eval` from rank 0.

Files in the launcher's workdir are DDP's: `local<L>.json`, `local<L>.jsonl`, `local<L>.error.json`
and rank 0's `final_params.pt` (the full parameters, gathered).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

from ddpviz.engine.components.loop import drive
from ddpviz.engine.components.training import evaluate, make_optimizer
from ddpviz.engine.config import RunConfig
from ddpviz.engine.data import load_dataset
from ddpviz.engine.measure.clocks import CudaClock, HostClock
from ddpviz.engine.measure.telemetry import Telemetry
from ddpviz.engine.models import build_model
from ddpviz.engine.modes.fsdp.collectives import CollectiveLog, install_recorders
from ddpviz.engine.modes.fsdp.memory import FsdpMemoryProbe, fsdp_memory_sampler
from ddpviz.engine.modes.fsdp.step import StepRunner
from ddpviz.engine.modes.fsdp.units import ROOT, fsdp_preview, shard_order, unit_modules
from ddpviz.engine.modes.ranks import init_rank, progress, run_rank

_DTYPES = {"float32": None, "bfloat16": torch.bfloat16}  # None: keep the parameter's own dtype


def rank_main(cfg_dict: dict, run_id: str, workdir: str, backend: str, device_kind: str,
              host: str = "", env: dict[str, str] | None = None) -> None:
    """Entry point of one FSDP rank (the `rank_fn` given to `engine.modes.launcher.launch_ranks`):
    `engine.modes.ranks.run_rank` around `_train_rank`, with DDP's arguments and files."""
    run_rank(_train_rank, cfg_dict, run_id, workdir, backend, device_kind, host, env)


def shard_model(model: nn.Module, cfg: RunConfig, device: torch.device) -> list[tuple[str, nn.Module]]:
    """`fully_shard` every unit (deepest first), then the root; returns [(unit name, module)].

    Non-root units use `cfg.reshard_after_forward`; the root gets FSDP2's default (None: not
    resharded after forward, since backward needs it at once). Mixed precision follows
    `fsdp_param_dtype` / `fsdp_reduce_dtype` (`MixedPrecisionPolicy`).
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    # reduce_dtype None means "the compute dtype": with bf16 parameters, ask for fp32 explicitly.
    reduce_dtype = _DTYPES[cfg.fsdp_reduce_dtype] or (torch.float32 if cfg.fsdp_param_dtype != "float32" else None)
    mp = MixedPrecisionPolicy(param_dtype=_DTYPES[cfg.fsdp_param_dtype], reduce_dtype=reduce_dtype)
    units = []
    for name, mod in shard_order(unit_modules(model)):
        fully_shard(mod, mesh=mesh, reshard_after_forward=cfg.reshard_after_forward, mp_policy=mp)
        units.append((name, mod))
    fully_shard(model, mesh=mesh, mp_policy=mp)
    units.append((ROOT, model))
    return units


@torch.no_grad()
def full_params(model: nn.Module) -> torch.Tensor:
    """Every parameter gathered to full size, concatenated (P,) float32 on CPU — a collective:
    every rank must call it. Order and tying as `engine.components.training.flat_params` on the unsharded
    model (FSDP2 keeps the registration order)."""
    from torch.distributed.tensor import DTensor

    return torch.cat([(p.full_tensor() if isinstance(p, DTensor) else p).detach().float().cpu().reshape(-1)
                      for p in model.parameters()])


def _train_rank(cfg: RunConfig, run_id: str, rank: int, wd: Path, backend: str, device_kind: str,
                sink, host: str) -> None:
    env = init_rank(cfg, backend, device_kind)
    world, device = env.world_size, env.device
    tel = Telemetry(sink, run_id, rank=rank, device=env.device_name, host=host)
    ds = load_dataset(cfg)
    model = build_model(cfg, ds).to(device).train()
    note = fsdp_preview(cfg, model)["note"]
    if note and rank == 0:
        tel.emit("log", level="warning", message=note)
    units = shard_model(model, cfg, device)
    log = CollectiveLog(CudaClock(device) if device.type == "cuda" else HostClock())
    unrecorded = install_recorders(units, log)
    if unrecorded and rank == 0:
        tel.emit("log", level="warning", message=unrecorded)
    opt = make_optimizer(cfg, model.parameters())
    probe = FsdpMemoryProbe(model, opt, device)
    runner = StepRunner(cfg, rank, world, backend, device, ds, model, units, opt, log, probe, tel, progress)

    def evaluate_all_ranks(step: int) -> None:
        # Every rank runs the forward (FSDP all-gathers need all of them); rank 0 reports.
        val_loss, val_acc = evaluate(model, ds, device)
        if rank == 0:
            tel.emit("eval", step=step, val_loss=val_loss, val_accuracy=val_acc)

    sampler = fsdp_memory_sampler(cfg, tel, model, opt, device, units, lambda _i: runner.last_phases)
    runner.ledger = sampler.ledger
    try:
        drive(cfg, tel, sampler.wrap(runner.train_step), check_sync=evaluate_all_ranks)
    finally:
        sampler.close()
    final = full_params(model)
    if rank == 0:
        torch.save(final, wd / "final_params.pt")
