"""`mode=fsdp`: the code each rank process runs (started by `engine.launcher` like DDP's ranks).

Every rank builds the same model from the same seed, then FSDP2 (`torch.distributed.fsdp.
fully_shard`) shards it: one unit per block (`engine.fsdp_units`), then the root. Each rank keeps
1/n of every parameter, its gradient and its optimizer state. Before a unit's forward FSDP2
all-gathers the unit's parameters; after it (with `reshard_after_forward`) frees them again and
all-gathers them once more for backward; after a unit's backward it reduce-scatters the
gradients so each rank receives the average of its own shard (Rajbhandari et al. 2020, ZeRO-3;
PyTorch FSDP2 docs). The root keeps FSDP2's default: not resharded after forward.

Data, loss and optimizer are DDP's (`BatchPlan` shards via `DistributedSampler`), so after k
SGD steps the gathered parameters equal `mode=single`'s. Events: `step` (the split counts time
inside collectives as exposed comm: on CPU every FSDP2 collective blocks the training thread),
`fsdp_collective` and `comm_volume` on sampled steps (`engine.fsdp_events`), `memory` and
`fsdp_memory_curve` on sampled steps (`engine.fsdp_memory`), `eval` from rank 0.

Files in the launcher's workdir are DDP's: `local<L>.json`, `local<L>.jsonl`, `local<L>.error.json`
and rank 0's `final_params.pt` (the full parameters, gathered).
"""

from __future__ import annotations

import contextlib
import json
import os
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

from engine.comm_hook import CudaClock, HostClock
from engine.config import RunConfig
from engine.data import load_dataset
from engine.ddp import _device, die_with_parent
from engine.events import rank_sink
from engine.fsdp_events import CollectiveLog, install_recorders
from engine.fsdp_memory import FsdpMemoryProbe
from engine.fsdp_step import StepRunner
from engine.fsdp_units import ROOT, fsdp_preview, shard_order, unit_modules
from engine.loop import drive
from engine.models import build_model
from engine.telemetry import Telemetry
from engine.training import cpu_threads_per_rank, evaluate, make_optimizer

_progress: dict[str, int | None] = {"step": None}  # the step this rank is in, for its error report
_DTYPES = {"float32": None, "bfloat16": torch.bfloat16}  # None: keep the parameter's own dtype


def rank_main(cfg_dict: dict, run_id: str, workdir: str, backend: str, device_kind: str,
              host: str = "") -> None:
    """Entry point of one FSDP rank (the `rank_fn` given to `engine.launcher.launch_ddp`).

    Same arguments, environment and files as `engine.ddp.rank_main`.
    """
    die_with_parent()
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    wd = Path(workdir)
    (wd / f"local{local}.json").write_text(json.dumps(dict(rank=rank, pid=os.getpid(), host=host)))
    sink = rank_sink(wd / f"local{local}.jsonl")
    try:
        _train_rank(RunConfig(**cfg_dict), run_id, rank, wd, backend, device_kind, sink, host)
    except BaseException as exc:
        err = dict(rank=rank, step=_progress["step"], host=host, exception=f"{type(exc).__name__}: {exc}",
                   traceback="".join(traceback.format_exception(exc)))
        (wd / f"local{local}.error.json").write_text(json.dumps(err))
        raise
    finally:
        sink.close()
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()


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
    every rank must call it. Order and tying as `engine.training.flat_params` on the unsharded
    model (FSDP2 keeps the registration order)."""
    from torch.distributed.tensor import DTensor

    return torch.cat([(p.full_tensor() if isinstance(p, DTensor) else p).detach().float().cpu().reshape(-1)
                      for p in model.parameters()])


def _train_rank(cfg: RunConfig, run_id: str, rank: int, wd: Path, backend: str, device_kind: str,
                sink, host: str) -> None:
    local_rank, world = int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    device = _device(device_kind, local_rank)
    if device.type == "cpu":
        torch.set_num_threads(cpu_threads_per_rank(world))
    dist.init_process_group(backend, timeout=timedelta(seconds=cfg.collective_timeout_s))
    tel = Telemetry(sink, run_id, rank=rank, device=f"cuda:{local_rank}" if device.type == "cuda" else f"cpu:{rank}",
                    host=host)
    ds = load_dataset(cfg)
    model = build_model(cfg, ds).to(device).train()
    note = fsdp_preview(cfg, model)["note"]
    if note and rank == 0:
        tel.emit("log", level="warning", message=note)
    units = shard_model(model, cfg, device)
    log = CollectiveLog(CudaClock() if device.type == "cuda" else HostClock())
    install_recorders(units, log)
    opt = make_optimizer(cfg, model.parameters())
    probe = FsdpMemoryProbe(model, opt, device)
    runner = StepRunner(cfg, rank, world, backend, device, ds, model, units, opt, log, probe, tel, _progress)

    def evaluate_all_ranks(step: int) -> None:
        # Every rank runs the forward (FSDP all-gathers need all of them); rank 0 reports.
        val_loss, val_acc = evaluate(model, ds, device)
        if rank == 0:
            tel.emit("eval", step=step, val_loss=val_loss, val_accuracy=val_acc)

    drive(cfg, tel, runner.train_step, check_sync=evaluate_all_ranks)
    final = full_params(model)
    if rank == 0:
        torch.save(final, wd / "final_params.pt")
