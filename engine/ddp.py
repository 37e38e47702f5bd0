"""`mode=ddp`: the code each rank process runs (started by `engine.launcher` via elastic launch).

Every rank builds the same model from the same seed (so no weights are broadcast after start —
DDP's constructor only checks/broadcasts once), loads its own shard with `DistributedSampler`,
wraps the model in `torch.nn.parallel.DistributedDataParallel` with the run's knobs and the
recording comm hook, and steps its own optimizer on the averaged gradients.

Files in the launcher's workdir, by local rank L: `local<L>.json` ({rank, pid, host}) at start,
`local<L>.jsonl` events (batched; the launcher forwards them), and on failure `local<L>.error.json`
({rank, step, host, exception, traceback}) before the process exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from engine.buckets import ddp_bucket_cap_arg
from engine.comm_hook import BucketRecorder, CudaClock, HostClock, recording_hook
from engine.config import RunConfig
from engine.data import BatchPlan, load_dataset
from engine.events import BatchingSink, JsonlWriter
from engine.faults import maybe_diverge, maybe_fail
from engine.loop import drive
from engine.memory import ActivationCounter, accounted_event, buffer_bytes, cuda_event, grads_bytes, \
    optimizer_state_bytes, param_bytes, tensor_bytes
from engine.models import build_model
from engine.telemetry import Telemetry, now, step_fields, wall_ts
from engine.training import autocast, cpu_threads_per_rank, evaluate, flat_params, loss_fn, \
    make_optimizer, param_checksum

PR_SET_PDEATHSIG = 1
_progress: dict[str, int | None] = {"step": None}  # the step this rank is in, for its error report


class ReplicasDiverged(RuntimeError):
    """Parameter checksums differ between ranks."""


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent (the launcher) dies (prctl PDEATHSIG)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def rank_main(cfg_dict: dict, run_id: str, workdir: str, backend: str, device_kind: str,
              host: str = "") -> None:
    """Entry point of one rank. Reads RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT from the env.

    `host` labels this rank's events (the worker's identity, which tells hosts apart).
    """
    die_with_parent()
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    wd = Path(workdir)
    (wd / f"local{local}.json").write_text(json.dumps(dict(rank=rank, pid=os.getpid(), host=host)))
    sink = BatchingSink(JsonlWriter(wd / f"local{local}.jsonl"), flush_interval_s=0.1)
    try:
        _train_rank(RunConfig(**cfg_dict), run_id, rank, wd, backend, device_kind, sink, host)
    except BaseException as exc:
        err = dict(rank=rank, step=_progress["step"], host=host, exception=f"{type(exc).__name__}: {exc}",
                   traceback="".join(traceback.format_exception(exc)))
        tmp = wd / f"local{local}.error.json.tmp"  # renamed into place: never read half-written
        tmp.write_text(json.dumps(err))
        os.replace(tmp, wd / f"local{local}.error.json")
        raise
    finally:
        sink.close()
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()


def _device(device_kind: str, local_rank: int) -> torch.device:
    if device_kind == "cuda":
        torch.cuda.set_device(local_rank)
        return torch.device(f"cuda:{local_rank}")
    return torch.device("cpu")


def _train_rank(cfg: RunConfig, run_id: str, rank: int, wd: Path, backend: str, device_kind: str,
                sink, host: str) -> None:
    local_rank, world = int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    device = _device(device_kind, local_rank)
    if device.type == "cpu":
        torch.set_num_threads(cpu_threads_per_rank(world))
    dist.init_process_group(backend, timeout=timedelta(seconds=cfg.collective_timeout_s))
    dev_name = f"cuda:{local_rank}" if device.type == "cuda" else f"cpu:{rank}"
    tel = Telemetry(sink, run_id, rank=rank, device=dev_name, host=host)
    ds = load_dataset(cfg)
    model = build_model(cfg, ds).to(device).train()
    ddp = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None,
              bucket_cap_mb=ddp_bucket_cap_arg(cfg), gradient_as_bucket_view=cfg.gradient_as_bucket_view,
              static_graph=cfg.static_graph, find_unused_parameters=cfg.find_unused_parameters)
    names = {p.data_ptr(): n for n, p in model.named_parameters()}
    rec = BucketRecorder(world, cfg.overlap, names, CudaClock() if device.type == "cuda" else HostClock())
    ddp.register_comm_hook(rec, recording_hook)
    opt = make_optimizer(cfg, ddp.parameters())
    plan = BatchPlan(len(ds), world, cfg.micro_batch_per_device, cfg.seed)
    acts = ActivationCounter()
    held: dict[str, int] = {}
    P = param_bytes(model)
    ring = 2 * (world - 1) / world  # ring all-reduce: bytes each rank sends (and receives) per byte

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def train_step(step: int) -> dict:
        _progress["step"] = step
        t0 = now()
        fwd = bwd = exposed = 0.0
        loss_sum = 0.0
        for micro in range(cfg.grad_accum_steps):
            last_micro = micro == cfg.grad_accum_steps - 1
            idx = plan.rank_indices(step * cfg.grad_accum_steps + micro, rank)
            x, y = ds.x_train[idx].to(device), ds.y_train[idx].to(device)
            maybe_fail(cfg, rank, step)
            ctx = contextlib.nullcontext() if last_micro else ddp.no_sync()  # all-reduce once per step
            with ctx:
                t1 = now()
                with acts, autocast(cfg, device.type):
                    loss = loss_fn(ddp(x), y) / cfg.grad_accum_steps
                sync()
                t2 = now()
                if last_micro:
                    rec.begin_backward()
                    backward_start = now()
                loss.backward()
                sync()
                t3 = now()
            fwd, loss_sum = fwd + t2 - t1, loss_sum + loss.item()
            if last_micro:
                buckets = rec.resolved()
                last_ready = max((b["ready_s"] for b in buckets), default=t3 - t2)
                exposed = max(0.0, (t3 - t2) - last_ready)
                bwd += (t3 - t2) - exposed
            else:
                bwd += t3 - t2
            held.update(activations=acts.nbytes, inputs=tensor_bytes([x, y]))
        t4 = now()
        opt.step()
        opt.zero_grad(set_to_none=not cfg.gradient_as_bucket_view)
        maybe_diverge(cfg, rank, step, model)
        sync()
        t5 = now()
        for b in buckets:
            tel.emit("bucket", step=step, **b)
        nbytes = sum(b["nbytes"] for b in buckets)
        tel.emit("comm_volume", step=step, sent_bytes=int(ring * nbytes), recv_bytes=int(ring * nbytes),
                 theory_sent_bytes=int(ring * P), theory_recv_bytes=int(ring * P))
        return step_fields(start=t0, backward_start_ts=wall_ts(backward_start), loss=loss_sum,
                           samples=cfg.global_batch_size, step_time_s=t5 - t0,
                           forward_s=fwd, backward_s=bwd, comm_exposed_s=exposed, optimizer_s=t5 - t4)

    def memory(step: int) -> None:
        bd = dict(params=param_bytes(model), grads=grads_bytes(model), buffers=buffer_bytes(model),
                  optimizer_state=optimizer_state_bytes(opt), **held)
        if not cfg.gradient_as_bucket_view:
            bd["bucket_buffers"] = P  # the reducer's flat buckets hold a second copy of the grads
        tel.emit("memory", step=step, **(cuda_event(device, bd) if device.type == "cuda" else accounted_event(bd)))

    def check_sync(step: int) -> None:
        mine = torch.tensor(param_checksum(model), dtype=torch.float64, device=device)
        every = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(every, mine)
        sums = [t.tolist() for t in every]
        in_sync = all(s == sums[0] for s in sums)
        if rank == 0:
            tel.emit("sync", step=step, checksums=sums, in_sync=in_sync)
        if not in_sync:
            raise ReplicasDiverged(f"replicas diverged at step {step}: parameter checksums {sums}")

    evaluate_fn = (lambda: evaluate(model, ds, device)) if rank == 0 else None
    drive(cfg, tel, train_step, memory=memory, check_sync=check_sync, evaluate=evaluate_fn)
    if rank == 0:
        torch.save(flat_params(model), wd / "final_params.pt")
