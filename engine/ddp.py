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
from engine.comm_hook import CudaClock, HostClock, recording_hook
from engine.config import RunConfig
from engine.data import BatchPlan, load_dataset
from engine.events import rank_sink
from engine.faults import maybe_diverge, maybe_fail
from engine.loop import drive
from engine.ddp_memory import BufferProbe, MemoryBucketRecorder, keep_before_traced
from engine.memory import param_bytes
from engine.models import build_model
from engine.telemetry import Telemetry, now, step_fields, wall_ts
from engine.single import single_sampler
from engine.training import autocast, cpu_threads_per_rank, evaluate, flat_params, loss_fn, \
    make_optimizer, param_checksum, should_eval

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
    sink = rank_sink(wd / f"local{local}.jsonl")
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
              static_graph=cfg.static_graph, find_unused_parameters=cfg.find_unused_parameters,
              broadcast_buffers=cfg.broadcast_buffers)
    names = {p.data_ptr(): n for n, p in model.named_parameters()}
    rec = MemoryBucketRecorder(world, cfg.overlap, names, CudaClock() if device.type == "cuda" else HostClock(),
                               predivided=True)  # the loss is scaled by 1/world below
    ddp.register_comm_hook(rec, recording_hook)
    opt = make_optimizer(cfg, ddp.parameters())
    plan = BatchPlan(len(ds), world, cfg.micro_batch_per_device, cfg.seed)
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
                with autocast(cfg, device.type):
                    loss = loss_fn(ddp(x), y) / cfg.grad_accum_steps
                sync()
                t2 = now()
                if last_micro:
                    rec.begin_backward()
                    backward_start = now()
                # gradient pre-division (engine.comm_hook): the gradients reach DDP's buckets already
                # divided by world_size, so the hook's all-reduce (sum) gives the mean, no pass over them
                (loss / world if world > 1 else loss).backward()
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
        t4 = now()
        opt.step()
        opt.zero_grad(set_to_none=not cfg.gradient_as_bucket_view)
        maybe_diverge(cfg, rank, step, model)
        sync()
        t5 = now()
        for b in buckets:
            tel.emit("bucket", step=step, **b)
        nbytes = sum(b["nbytes"] for b in buckets)  # of the bucket tensors handed to all-reduce
        tel.emit("comm_volume", step=step, allreduce_bytes=nbytes, sent_bytes=int(ring * nbytes),
                 recv_bytes=int(ring * nbytes), volume_source="derived (ring all-reduce)",
                 theory_sent_bytes=int(ring * P), theory_recv_bytes=int(ring * P))
        return step_fields(start=t0, backward_start_ts=wall_ts(backward_start), loss=loss_sum,
                           samples=cfg.global_batch_size, step_time_s=t5 - t0,
                           forward_s=fwd, backward_s=bwd, comm_exposed_s=exposed, optimizer_s=t5 - t4)

    sampler = single_sampler(cfg, tel, model, opt, device, extra_existing=lambda: [
        (0, "bucket_buffers", rec.take_kept())])
    rec.ledger = sampler.ledger
    buffer_probe = BufferProbe(model)

    def check_sync(step: int) -> None:
        # one all_gather: [parameter checksum, buffers at forward start, buffers after the step]
        mine = torch.cat([torch.tensor(param_checksum(model), dtype=torch.float64),
                          buffer_probe.local().reshape(-1)]).to(device)
        every = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(every, mine)
        sums = [t[:2].tolist() for t in every]
        in_sync = all(s == sums[0] for s in sums)
        if rank == 0:
            bufs = buffer_probe.rows([t[2:].cpu().reshape(2, -1, 2) for t in every])
            tel.emit("sync", step=step, checksums=sums, in_sync=in_sync, buffers=bufs,
                     checked="parameters after the optimizer step, all-gathered from every rank")
        if not in_sync:
            raise ReplicasDiverged(f"replicas diverged at step {step}: parameter checksums {sums}")

    evaluate_fn = (lambda: evaluate(model, ds, device)) if rank == 0 else None
    step_fn = keep_before_traced(buffer_probe.wrap(train_step, lambda s: should_eval(cfg, s)), rec, cfg.steps)
    try:
        drive(cfg, tel, sampler.wrap(step_fn), check_sync=check_sync, evaluate=evaluate_fn)
    finally:
        sampler.close()
    if cfg.probe and world > 1:  # after the last step: in no step time, nothing else in flight
        from engine.probe import emit_probe  # imported here: this hook stays one block

        emit_probe(tel, device)
    if rank == 0:
        torch.save(flat_params(model), wd / "final_params.pt")
