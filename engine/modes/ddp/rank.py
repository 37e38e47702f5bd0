"""`mode=ddp`: the code each rank process runs (started by `engine.modes.launcher` via elastic launch).

Every rank builds the same model from the same seed (so no weights are broadcast after start —
DDP's constructor only checks/broadcasts once), loads its own shard with `DistributedSampler`,
wraps the model in `torch.nn.parallel.DistributedDataParallel` with the run's knobs and the
recording comm hook, and steps its own optimizer on the averaged gradients.

Files in the launcher's workdir: those of every rank (`engine.modes.ranks`), and rank 0's
`final_params.pt`.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ddpviz.engine.components.faults import diverge_note, maybe_diverge, maybe_fail
from ddpviz.engine.components.loop import drive
from ddpviz.engine.components.training import (autocast, batch_to, evaluate, flat_params, make_optimizer, micro_loss,
                                               should_eval)
from ddpviz.engine.config import RunConfig
from ddpviz.engine.data import BatchPlan, load_dataset
from ddpviz.engine.events import mark_nonfinite
from ddpviz.engine.batching import Later
from ddpviz.engine.measure.clocks import CudaClock, HostClock, StepClock
from ddpviz.engine.measure.deferred import deferred_steps
from ddpviz.engine.measure.gil import MeterGate
from ddpviz.engine.measure.gil_rank import MeteredClock, rank_step_fields
from ddpviz.engine.measure.memory import param_bytes
from ddpviz.engine.measure.memory_sampler import model_memory_sampler, should_trace_memory
from ddpviz.engine.measure.sync import param_checksum
from ddpviz.engine.measure.telemetry import Telemetry, now, step_fields, wall_ts
from ddpviz.engine.models import build_model
from ddpviz.engine.modes.ddp.buckets import buffer_sync_arg, ddp_bucket_cap_arg
from ddpviz.engine.modes.ddp.comm_hook import recording_hook
from ddpviz.engine.modes.ddp.comm_hooks import compose, selected_hook, volume_label
from ddpviz.engine.modes.ddp.flight import no_hook_path
from ddpviz.engine.modes.ddp.reducer import READY_EXPOSED_SOURCE, READY_SOURCE, LayoutBuckets
from ddpviz.engine.modes.ddp.memory import BufferProbe, MemoryBucketRecorder, keep_before_traced
from ddpviz.engine.modes.ranks import init_rank, progress, run_rank


NO_BUCKET_TIMES = ("not measured on this step (bucket_timing=recorder on gloo: no ready times before DDP's rebuilt "
                   "layout is known, bucket spans on sampled steps only)")


def exposed_comm(buckets: list[dict], last_bwd_s: float, cuda: bool) -> tuple[float | None, dict]:
    """(exposed comm of the step's last backward in s, extra step fields): the backward's time after
    its last bucket was ready — with the Python hook its `ready_s`, with no hook on gloo the reducer's own
    ready time (`LayoutBuckets`, `comm_exposed_source` says so). Not measured (None, `comm_exposed_measured`
    false) without ready times: with no hook on CUDA, where the reducer's stamps are host launch times and
    the backward's end a GPU event; on gloo before DDP's rebuilt layout is known (`NO_BUCKET_TIMES`)."""
    if not buckets or buckets[0].get("ready_s") is not None:
        exposed = max(0.0, last_bwd_s - max((b["ready_s"] for b in buckets), default=last_bwd_s))
        reducer = bool(buckets) and buckets[0].get("source") == READY_SOURCE
        return exposed, dict(comm_exposed_source=READY_EXPOSED_SOURCE) if reducer else {}
    if cuda:
        return None, dict(comm_exposed_measured=False)
    return None, dict(comm_exposed_measured=False, comm_exposed_note=NO_BUCKET_TIMES)


class ReplicasDiverged(RuntimeError):
    """Parameter checksums differ between ranks."""


def rank_main(cfg_dict: dict, run_id: str, workdir: str, backend: str, device_kind: str,
              host: str = "", env: dict[str, str] | None = None) -> None:
    """Entry point of one DDP rank (`engine.modes.ranks.run_rank` around `_train_rank`).

    Reads RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT from the env; `host` labels this rank's
    events (the worker's identity, which tells hosts apart).
    """
    run_rank(_train_rank, cfg_dict, run_id, workdir, backend, device_kind, host, env)


def _train_rank(cfg: RunConfig, run_id: str, rank: int, wd: Path, backend: str, device_kind: str,
                sink, host: str) -> None:
    ds = load_dataset(cfg)
    model = build_model(cfg, ds)  # seeded by cfg.seed: the same weights on every rank, before or after the group
    no_hook = no_hook_path(cfg, backend, model)
    env = init_rank(cfg, backend, device_kind)
    local_rank, world, device = env.local_rank, env.world_size, env.device
    tel = Telemetry(sink, run_id, rank=rank, device=env.device_name, host=host)
    model = model.to(device).train()
    ddp = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None,
              bucket_cap_mb=ddp_bucket_cap_arg(cfg), gradient_as_bucket_view=cfg.gradient_as_bucket_view,
              static_graph=cfg.static_graph, find_unused_parameters=cfg.find_unused_parameters,
              **buffer_sync_arg(cfg.broadcast_buffers))
    names = {p.data_ptr(): n for n, p in model.named_parameters()}
    meter = MeterGate()  # the steps whose marks read this thread's clocks (engine.measure.gil)
    rec = MemoryBucketRecorder(world, cfg.overlap, names,  # its marks read this thread's clocks too
                               MeteredClock(CudaClock(device) if device.type == "cuda" else HostClock(), meter),
                               predivided=True)  # the loss is scaled by 1/world below
    bucket_log: LayoutBuckets | MemoryBucketRecorder = rec
    if no_hook:  # no comm hook: DDP divides while copying into buckets; no Python per bucket
        rec.predivided = False
        bucket_log = LayoutBuckets(ddp, names)  # the reducer's stamps: ready (CPU) or launch (CUDA) times
    else:
        selected = selected_hook(cfg)
        if selected is not None:  # fp16/bf16/PowerSGD inside the recording; it averages: no pre-division
            compose(rec, *selected)
        ddp.register_comm_hook(rec, recording_hook)
    opt = make_optimizer(cfg, ddp.parameters())
    plan = BatchPlan(len(ds), world, cfg.micro_batch_per_device, cfg.seed)
    P = param_bytes(model)
    ring = 2 * (world - 1) / world  # ring all-reduce: bytes each rank sends (and receives) per byte

    # CUDA events (engine.measure.clocks); on the metered steps each mark also reads this thread's clocks,
    # for its lock wait (engine.measure.gil)
    clock = MeteredClock(StepClock(device), meter)
    # On CUDA a step's figures are read once its events completed, a step or more later (`DeferredSteps`):
    # a plain DDP loop never waits for the GPU, so no step here does but the metered, memory-traced and
    # last ones, which are marked as instrumented and synchronise once (`StepClock.settle`)
    later = deferred_steps(device)

    bucket_nbytes: list[int] = []  # of the latest step's buckets
    layout = isinstance(bucket_log, LayoutBuckets)
    volume: list = [None, None]  # (bucket sizes, their comm_volume fields): worked out when the sizes change
    # Steps on which nothing needs the marks' extra readings (CPU, one micro-batch): `ordinary_step`
    ordinary_ok = device.type == "cpu" and cfg.grad_accum_steps == 1 and later is None

    def volume_due(buckets: list[dict], traced: bool) -> bool:
        """Whether the step emits `comm_volume`: its bucket sizes differ from the previous step's, or it
        is memory-traced (steps 0-2, every k-th, the last). Between those, every step hands all-reduce
        the same bytes, so its event would repeat the last one (the views read the latest)."""
        sizes = tuple(b["nbytes"] or 0 for b in buckets)  # of the bucket tensors handed to all-reduce
        if volume[0] == sizes:
            return traced
        bucket_nbytes[:] = [n for n in sizes if n]  # the probe's first sizes
        nbytes = sum(sizes)  # one entry: a hook whose sizes vary (compression) never grows a cache
        volume[:] = sizes, dict(allreduce_bytes=nbytes, sent_bytes=int(ring * nbytes),
                                recv_bytes=int(ring * nbytes), volume_source=volume_label(rec),
                                theory_sent_bytes=int(ring * P), theory_recv_bytes=int(ring * P))
        return True

    staged: dict[int, list[dict]] = {}  # each step's built events, handed over with its step event (emit_step)

    def finish(step: int, t0: float, t5: float, fwd: float, bwd: float, last_bwd: float, backward_start: float,
               optimizer_s: float, loss: float, gil: dict | None = None, traced: bool = True,
               buckets: list[dict] | None = None) -> dict:
        """The step's bucket, `gil` (when given) and comm_volume (`volume_due`) events, staged for
        `emit_step`, and its `step` fields, from its measured phases (s). `buckets`: the step's bucket
        rows (`taken`), else the recorder's latest (`resolved()`: the last micro-batch's backward)."""
        buckets = bucket_log.resolved() if buckets is None else buckets
        exposed, exposed_fields = exposed_comm(buckets, last_bwd, device.type == "cuda")
        events = tel.build_many("bucket", buckets, step=step)  # one stamp per step, not per bucket
        if gil is not None:
            events.append(tel.build("gil", step=step, **gil))
        if volume_due(buckets, traced):
            events.append(tel.build("comm_volume", step=step, **volume[1]))
        staged[step] = events
        return fields_of(t0, t5, fwd, bwd, backward_start, optimizer_s, loss, exposed, exposed_fields)

    def fields_of(t0: float, t5: float, fwd: float, bwd: float, backward_start: float, optimizer_s: float,
                  loss: float, exposed: float | None, exposed_fields: dict) -> dict:
        return step_fields(start=t0, backward_start_ts=wall_ts(backward_start), loss=loss,
                           samples=cfg.global_batch_size, step_time_s=t5 - t0, forward_s=fwd,
                           backward_s=bwd - (exposed or 0.0), comm_exposed_s=exposed, optimizer_s=optimizer_s,
                           **exposed_fields)

    heads: list = [None, None, tel.head("step")]  # (layout, its bucket event heads), the step event's head

    def ordinary_finish(step: int, t0: float, t2: float, t4: float, fwd: float, bwd: float, optimizer_s: float,
                        loss: float) -> dict:
        """`finish` for an ordinary step whose buckets are the steady layout's with the reducer's ready
        times (`LayoutBuckets.steady_readies`): the same events, from per-layout heads (`Telemetry.head`).
        Once the layout is known they are built by the event writer's thread (`ordinary_events`, handed
        over as a `Later` by `emit_step`): this thread keeps the readings only, and returns the one field
        `drive` reads (the loss). Else `finish` itself."""
        readies = bucket_log.steady_readies() if layout else None
        if readies is None:
            return finish(step, t0, t4, fwd, bwd, bwd, t2, optimizer_s, loss, traced=False)
        ts = time.time()
        if heads[0] is bucket_log.layout:
            staged[step] = Later(ordinary_events, (heads[1], heads[2], ts, step, readies, t0, t2, t4, fwd, bwd,
                                                   optimizer_s, loss), len(readies) + 1)
            return {"loss": loss}  # what drive reads (check_loss); the step event is built with the rest
        heads[:2] = bucket_log.layout, [tel.head("bucket", **row) for row in bucket_log.steady_rows()]
        buckets = [{**h, "ts": ts, "step": step, "ready_s": r} for h, r in zip(heads[1], readies)]
        exposed, exposed_fields = exposed_comm(buckets, bwd, False)
        if volume_due(buckets, False):  # a new layout with new sizes: one comm_volume
            buckets.append(tel.build("comm_volume", step=step, **volume[1]))
        staged[step] = buckets
        return fields_of(t0, t4, fwd, bwd, t2, optimizer_s, loss, exposed, exposed_fields)

    def ordinary_events(bucket_heads: list[dict], step_head: dict, ts: float, step: int, readies: list[float],
                        t0: float, t2: float, t4: float, fwd: float, bwd: float, optimizer_s: float,
                        loss: float) -> list[dict]:
        """An ordinary step's bucket events and step event, from its readings (`ordinary_finish`); called on
        the event writer's thread (`BatchingSink`), so it reads nothing that changes after the step."""
        events = [{**h, "ts": ts, "step": step, "ready_s": r} for h, r in zip(bucket_heads, readies)]
        exposed, exposed_fields = exposed_comm(events, bwd, False)
        fields = fields_of(t0, t4, fwd, bwd, t2, optimizer_s, loss, exposed, exposed_fields)
        events.append({**step_head, "ts": ts, "step": step,
                       **(fields if loss - loss == 0 else mark_nonfinite(fields))})
        return events

    def emit_step(step: int, fields: dict) -> None:
        """The step event (`engine.components.loop.drive`), with the step's staged events before it."""
        events = staged.pop(step, None)
        if not events:
            tel.emit("step", step=step, **fields)
            return
        if type(events) is Later:  # an ordinary step's: built on the writer's thread, `fields` among them
            tel.hand_over_later(events)
            return
        loss = fields["loss"]  # the one field a step can make non-finite (the rest are clock differences)
        events.append({**heads[2], "ts": events[0]["ts"], "step": step,
                       **(fields if loss - loss == 0 else mark_nonfinite(fields))})
        tel.hand_over(events)

    def ordinary_step(step: int) -> dict:
        """A step on CPU with one micro-batch that is not metered, traced or sampled: the same work and
        events as `train_step`'s, its phases read with the host clock directly (no mark objects, no
        per-micro-batch lists), its events built by `ordinary_finish`. On 2 gloo ranks, MLP 128x3: the
        training thread's time between steps 79-106 -> 56-59 µs (`plain_alone`'s `between_steps_us`;
        docs/bench/small-step-alone-2026-12-05.json, "ordinary_steps", "lean_ordinary_events"), then 51-54 ->
        33-42 µs with the events built on the writer's thread (docs/bench/small-step-later-2026-12-06.json)."""
        t0 = now()
        idx = plan.rank_indices(step, rank)
        x, y = ds.x_train[idx].to(device), ds.y_train[idx].to(device)
        maybe_fail(cfg, rank, step)
        t1 = now()
        with autocast(cfg, device.type):
            out = ddp(x)
            if layout:  # the reducer's ready-time origin
                bucket_log.forward_returned()
            loss = micro_loss(out, y, 1)
        t2 = now()
        bucket_log.begin_backward()
        (loss / world if world > 1 and rec.predivided else loss).backward()
        t3 = now()
        opt.step()
        opt.zero_grad(set_to_none=not cfg.gradient_as_bucket_view)
        maybe_diverge(cfg, rank, step, model, tel)
        del x, y, out  # freed inside the step, as a plain loop frees them when it rebinds the names
        t4 = now()
        # the loss read: ddpviz's; `item()` (0.46 µs here) rather than float() of a detached copy (1.4 µs), and
        # without float()'s warning on a tensor that needs grad (torch 2.13)
        return ordinary_finish(step, t0, t2, t4, t2 - t1, t3 - t2, t4 - t3, loss.item())

    def train_step(step: int) -> dict:
        progress["step"] = step
        traced = should_trace_memory(step, cfg.steps)
        if layout:  # full spans on the memory-traced steps (their last micro-batch's backward), none on others
            bucket_log.sample_next = traced
        metered = meter.begin_step(step)
        if not metered and ordinary_ok and not traced:
            return ordinary_step(step)
        t0, m0 = now(), clock.time_mark()  # a time origin only: no lock-wait span starts here
        micro_marks, losses = [], []
        for micro in range(cfg.grad_accum_steps):
            last_micro = micro == cfg.grad_accum_steps - 1
            idx = plan.rank_indices(step * cfg.grad_accum_steps + micro, rank)
            x, y = batch_to(ds.x_train[idx], device), batch_to(ds.y_train[idx], device)
            maybe_fail(cfg, rank, step)
            ctx = contextlib.nullcontext() if last_micro else ddp.no_sync()  # all-reduce once per step
            with ctx:
                m1 = clock.mark()
                with autocast(cfg, device.type):
                    out = ddp(x)
                    if last_micro and layout:  # the reducer's ready-time origin
                        bucket_log.forward_returned()
                    loss = micro_loss(out, y, cfg.grad_accum_steps)
                m2 = clock.mark()
                if last_micro:
                    bucket_log.begin_backward()
                # gradient pre-division (engine.modes.ddp.comm_hook): the gradients reach DDP's buckets already
                # divided by world_size, so the hook's all-reduce (sum) gives the mean, no pass over them
                (loss / world if world > 1 and rec.predivided else loss).backward()
                micro_marks.append((m1, m2, clock.mark()))
            losses.append(loss.detach())
        m4 = clock.mark()
        opt.step()
        opt.zero_grad(set_to_none=not cfg.gradient_as_bucket_view)
        maybe_diverge(cfg, rank, step, model, tel)
        m5 = clock.mark()

        def fields_at(t5: float, loss: float, gil: dict | None = None, buckets: list[dict] | None = None) -> dict:
            return finish(step, t0, t5, sum(clock.seconds(a, b) for a, b, _ in micro_marks),
                          sum(clock.seconds(b, c) for _, b, c in micro_marks), clock.seconds(*micro_marks[-1][1:]),
                          t0 + clock.seconds(m0, micro_marks[-1][1]), clock.seconds(m4, m5), loss, gil,
                          traced or step == cfg.steps - 1, buckets)

        if later is not None and not metered and not traced:  # read once its events completed: no synchronize
            # `() -> this step's bucket rows`, called once its marks completed: the hook's records of this
            # backward (`BucketRecorder.taken`) or the layout's rows read now (`LayoutBuckets.taken`)
            rows = bucket_log.taken()
            later.add_step(step, clock, m0, m5, losses, lambda s, loss: fields_at(t0 + s, loss, buckets=rows()))
            return None
        clock.settle()
        t5 = now()
        if later is not None:  # the steps before it, complete now, sent first: `volume_due` compares in step order
            later.flush()
        gil = None
        if meter.on:
            last_ready = next((r["ready"] for r in reversed(rec.records) if r["ready"].clocks is not None), None)
            gil = rank_step_fields(micro_marks, (m4, m5), t5 - t0, last_ready, device.type == "cuda", note=meter.note())
        # with steps read late, the device may still have been running earlier steps at t0: the step's own
        # time is its marks' (the host's wall time from t0 would count the end of those steps again)
        return fields_at(t5 if later is None else t0 + clock.seconds(m0, m5), sum(float(v) for v in losses), gil)

    sampler = model_memory_sampler(cfg, tel, model, opt, device, extra_existing=lambda: [
        (0, "bucket_buffers", bucket_log.held_nbytes(cfg.gradient_as_bucket_view)
         if isinstance(bucket_log, LayoutBuckets) else rec.take_kept())])
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
            cause = f" ({diverge_note(cfg)})" if cfg.fault == "diverge" and step >= cfg.fault_step else ""
            raise ReplicasDiverged(f"replicas diverged at step {step}: parameter checksums {sums}{cause}")

    evaluate_fn = (lambda: evaluate(model, ds, device)) if rank == 0 else None
    step_fn = keep_before_traced(buffer_probe.wrap(train_step, lambda s: should_eval(cfg, s)), rec, cfg.steps)
    train_start = now()
    try:
        drive(cfg, tel, sampler.wrap(step_fn), check_sync=check_sync, evaluate=evaluate_fn, emit_step=emit_step,
              later=later)
    finally:
        sampler.close()
    if cfg.probe and world > 1:  # after the last step: in no step time, nothing else in flight
        from ddpviz.engine.modes.ddp.probe import emit_probe, run_budget_s  # imported here: this hook stays one block

        # the run's own bucket sizes first; a budget in proportion to the training
        emit_probe(tel, device, run_nbytes=bucket_nbytes, budget_s=run_budget_s(now() - train_start))
    if rank == 0:
        torch.save(flat_params(model), wd / "final_params.pt")
