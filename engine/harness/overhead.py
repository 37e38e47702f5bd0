"""What the instrument costs: plain torch DDP against ddpviz's instrumented DDP on the same work.

`measure_overhead(cfg)` runs (a) a plain DDP loop — PyTorch's built-in all-reduce, no comm hook,
no events, no per-step synchronisation — in rank processes of its own, and (b) `ddpviz` DDP
(`engine.run.run_training`, mode ddp) with the same model, seed, data shards, batch, optimizer,
bucket cap, backend and threads, **at the same time, taking turns** (`engine.measure.turns`): each side
trains a block of `block_steps` steps while the other waits blocked on a socket, in the order
plain, ddpviz, ddpviz, plain, plain, ddpviz, ... (ABBA, so neither side always goes first). One
round is one block of each side, adjacent in time. On this 2-core VM the same loop's step time
drifts 30-60% over seconds, so whole runs one after another (the previous harness) measured the
machine: its rounds ranged 0.93-1.8x on one build; blocks a fraction of a second apart do not.

Step time: the interval between consecutive step starts on rank 0 within a block (ddpviz:
`start_ts` of its `step` events; plain: the same clock, `wall_ts(perf_counter())`), so it
includes whatever runs between steps; each block's first interval (after a wait) is dropped and
its median taken. On CUDA the host queues work steps ahead of the GPU, so there a block's step
time is its wall time per step, GPU work included (`block_walls`). A round's ratio is ddpviz's
block figure over plain's; the reported `ratio` is the median of the rounds' ratios, with a 90%
bootstrap interval over rounds, and `ratio_untraced` the same over the rounds whose ddpviz block
held no memory-traced step (`untraced_figures`). The first
`warmup_blocks` blocks of each side are not counted. Background work of the idle side keeps
running during the other side's blocks (ddpviz's memory timer, its rank event flushes and its
launcher's file follower), so their cost, a few ms of CPU per second, is shared by both sides.

Also returned: the largest difference between the two sides' final parameters (0 up to float
rounding when both did the same work), so a ratio is never reported for different work.
Works on CPU (gloo) and CUDA (NCCL, world_size <= GPUs; the plain side synchronises at block
ends so a block's GPU work stays in its block).
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import tempfile
import threading
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ddpviz.engine.config import RunConfig
from ddpviz.engine.measure.bootstrap import block_medians, median_interval
from ddpviz.engine.measure.telemetry import now, wall_ts
from ddpviz.engine.measure.turns import GATE_ENV, TurnController, gate_from_env
from ddpviz.engine.modes.ranks import join_process_group, leave_process_group, start_rank_processes

DEFAULT_BLOCK_STEPS = 50


def _plain_rank(rank: int, cfg_dict: dict, backend: str, device_kind: str, init_file: str,
                out_dir: str) -> None:
    """One rank of the plain loop (`start_rank_processes` target); takes turns when the
    environment holds `engine.measure.turns.GATE_ENV`."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddpviz.engine.components.training import (autocast, batch_to, cpu_threads_per_rank, flat_params,
                                                   make_optimizer, micro_loss)
    from ddpviz.engine.data import BatchPlan, load_dataset
    from ddpviz.engine.models import build_model
    from ddpviz.engine.modes.ddp.buckets import ddp_bucket_cap_arg

    cfg = RunConfig(**cfg_dict)
    world, accum = cfg.world_size, cfg.grad_accum_steps
    if device_kind == "cuda":
        torch.cuda.set_device(rank)
        device = torch.device(f"cuda:{rank}")
    else:
        torch.set_num_threads(cpu_threads_per_rank(world))
        device = torch.device("cpu")
    join_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=cfg.collective_timeout_s))
    try:
        ds = load_dataset(cfg)
        model = build_model(cfg, ds).to(device).train()
        ddp = DDP(model, device_ids=[rank] if device_kind == "cuda" else None,
                  bucket_cap_mb=ddp_bucket_cap_arg(cfg), gradient_as_bucket_view=cfg.gradient_as_bucket_view,
                  static_graph=cfg.static_graph, find_unused_parameters=cfg.find_unused_parameters)
        opt = make_optimizer(cfg, ddp.parameters())
        plan = BatchPlan(len(ds), world, cfg.micro_batch_per_device, cfg.seed)
        gate = gate_from_env("plain", rank)
        starts, ends = [], []
        for step in range(cfg.steps):
            if gate is not None:
                if device_kind == "cuda" and step % gate.block_steps == 0:
                    torch.cuda.synchronize(device)  # the last block's GPU work ends in its block
                gate.at_step(step)
            starts.append(wall_ts(now()))
            for micro in range(accum):
                idx = plan.rank_indices(step * accum + micro, rank)
                x, y = batch_to(ds.x_train[idx], device), batch_to(ds.y_train[idx], device)  # as the rank
                with contextlib.nullcontext() if micro == accum - 1 else ddp.no_sync():
                    with autocast(cfg, device.type):
                        loss = micro_loss(ddp(x), y, accum)
                    loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=not cfg.gradient_as_bucket_view)
            ends.append(wall_ts(now()))  # as ddpviz's step_time_s ends: after zero_grad
        if device_kind == "cuda":
            torch.cuda.synchronize(device)
        if gate is not None:
            gate.at_end()
        if rank == 0:
            Path(out_dir, "plain.json").write_text(json.dumps({"step_starts": starts, "step_ends": ends}))
            torch.save(flat_params(model), Path(out_dir, "plain_params.pt"))
    finally:
        leave_process_group()


def _ddpviz_run(cfg: RunConfig, run_id: str) -> tuple[list[float], torch.Tensor, list[float], dict[str, set[int]]]:
    """Run `cfg` as ddpviz DDP; rank 0's step starts (unix s), final parameters, step ends (unix s:
    `start_ts + step_time_s`, the moment the step's training work ended), and its instrumented steps:
    ``{"traced": memory-traced steps (their step events' `memory_traced`), "metered": steps with a `gil` event}``.

    Raises:
        RuntimeError: the run did not succeed (its error included).
    """
    from ddpviz.engine.events import ListSink
    from ddpviz.engine.run import run_training

    sink = ListSink()
    result = run_training(cfg, sink, run_id)
    if result.status != "succeeded":
        raise RuntimeError(f"ddpviz DDP run {result.status}: {(result.error or {}).get('exception')}")
    steps = sorted((e for e in sink.of_type("step") if e.get("rank", 0) == 0), key=lambda e: e["step"])
    marked = dict(traced={e["step"] for e in steps if e.get("memory_traced")},
                  metered={e["step"] for e in sink.of_type("gil") if e.get("rank", 0) == 0})
    ends = [e["start_ts"] + e["step_time_s"] for e in steps]
    return [e["start_ts"] for e in steps], result.final_params, ends, marked


def turn_order(blocks: int, a: str = "plain", b: str = "ddpviz") -> list[str]:
    """Which side trains each block: a, b, b, a, a, b, ... (ABBA), `blocks` of each."""
    order: list[str] = []
    for k in range(blocks):
        order += [a, b] if k % 2 == 0 else [b, a]
    return order


def measure_overhead(cfg: RunConfig, rounds: int = 10, block_steps: int = DEFAULT_BLOCK_STEPS,
                     warmup_blocks: int = 1) -> dict[str, Any]:
    """Plain vs ddpviz DDP on `cfg`, taking turns block by block (module docstring).

    `cfg`'s mode is forced to ddp, with no step delay, evaluation only at the end, no probe, and
    steps = (warmup_blocks + rounds + tail) x block_steps (its own `steps` is not used), tail 1 on CUDA:
    a last block, not counted, that holds the run's end (its evaluation and checks).

    Returns:
        JSON-able dict: ``ratio`` (median over rounds of ddpviz / plain block median),
        ``ratio_interval_90`` (bootstrap), ``plain_median_step_s``, ``ddpviz_median_step_s``
        (medians over the counted blocks), ``rounds`` (per round: each side's block figure, the
        ratio, the ddpviz block's memory-traced and metered steps and its `own_step_time`, in order),
        ``ratio_untraced``, ``ratio_untraced_interval_90``, ``rounds_untraced`` (`untraced_figures`),
        ``schedule`` ([side, released, done] per block, unix s),
        ``block_spans`` (per side, each block's first and last step start, unix s),
        ``max_param_diff`` (final parameters, plain vs ddpviz), ``backend``, ``device_kind``,
        ``config``, ``source``.

    Raises:
        ValueError: rounds < 1, warmup_blocks < 0, block_steps < 4, or nnodes > 1.
        RuntimeError: a side failed (the ddpviz run's error, or the plain rank's).
    """

    from ddpviz.engine.components.devices import resolve_plan

    if rounds < 1:
        raise ValueError(f"rounds must be >= 1 (got {rounds})")
    if warmup_blocks < 0:
        raise ValueError(f"warmup_blocks must be >= 0 (got {warmup_blocks})")
    if block_steps < 4:
        raise ValueError(f"block_steps must be >= 4 (got {block_steps})")
    if cfg.nnodes != 1:
        raise ValueError(f"nnodes must be 1 for the overhead measurement (got {cfg.nnodes})")
    plan = resolve_plan(cfg.model_copy(update=dict(mode="ddp")))
    # on CUDA a block counts everything until its rank says done: the run's last block also holds its final
    # evaluation, replica check and memory trace, which plain never does, so a last block is run and not counted
    tail_blocks = 1 if plan.kind == "cuda" else 0
    blocks = warmup_blocks + rounds + tail_blocks
    cfg = cfg.model_copy(update=dict(mode="ddp", step_delay_s=0.0, eval_every=0, probe=False,
                                     steps=blocks * block_steps))
    run_id = f"overhead-{uuid.uuid4().hex[:8]}"  # the ddpviz side's name at the gate (engine.components.loop)
    ctl = TurnController({"plain": cfg.world_size, run_id: cfg.world_size}, block_steps)
    got: dict[str, Any] = {}

    def ddpviz_side() -> None:
        try:
            got["ddpviz"] = _ddpviz_run(cfg, run_id)
        except BaseException as exc:  # reported by the main thread
            got["ddpviz_error"] = exc

    def side_failed() -> RuntimeError:
        err = got["ddpviz_error"]
        return RuntimeError(f"the ddpviz side failed: {err}")

    with tempfile.TemporaryDirectory(prefix="ddpviz-overhead-") as tmp:
        os.environ[GATE_ENV] = ctl.spec  # inherited by both sides' rank processes
        try:
            plain = start_rank_processes(_plain_rank, (cfg.to_json_dict(), plan.backend, plan.kind,
                                                       f"{tmp}/pg", tmp), cfg.world_size, join=False)
            side = threading.Thread(target=ddpviz_side, name="ddpviz-overhead-side", daemon=True)
            side.start()
            try:
                ctl.run(turn_order(blocks, "plain", run_id),
                        alive=lambda: side.is_alive() and all(p.is_alive() or p.exitcode == 0
                                                              for p in plain.processes))
            except BaseException:
                for p in plain.processes:
                    if p.is_alive():
                        p.terminate()
                side.join(timeout=120)
                if "ddpviz_error" in got:
                    raise side_failed() from got["ddpviz_error"]
                raise
        finally:
            os.environ.pop(GATE_ENV, None)
        while not plain.join():
            pass
        side.join()
        if "ddpviz_error" in got:
            raise side_failed() from got["ddpviz_error"]
        plain_starts = json.loads(Path(tmp, "plain.json").read_text())["step_starts"]
        plain_params = torch.load(Path(tmp, "plain_params.pt"))
    ours_starts, ours_params, ours_ends, marked = got["ddpviz"]
    counted = slice(warmup_blocks, warmup_blocks + rounds)
    if plan.kind == "cuda":  # the host runs ahead of the GPU: a block's wall, its GPU work waited for
        p_med, d_med = block_walls(ctl.block_log, "plain", block_steps), block_walls(ctl.block_log, run_id, block_steps)
    else:
        p_med, d_med = block_medians(plain_starts, block_steps), block_medians(ours_starts, block_steps)
    rows = [dict(plain_median_step_s=p, ddpviz_median_step_s=d, ratio=d / p,
                 ddpviz_own_step_s=own_step_time(ours_starts, ours_ends, marked, b, block_steps),
                 **{f"ddpviz_{k}_steps": sorted(x for x in marked[k] if x in block_range(b, block_steps))
                    for k in ("traced", "metered")})
            for b, (p, d) in list(enumerate(zip(p_med, d_med)))[counted]]
    ratios = [r["ratio"] for r in rows]
    return dict(ratio=statistics.median(ratios), ratio_interval_90=median_interval(ratios),
                **untraced_figures(rows),
                plain_median_step_s=statistics.median(p_med[counted]),
                ddpviz_median_step_s=statistics.median(d_med[counted]), tail_blocks=tail_blocks,
                rounds=rows, block_steps=block_steps, warmup_blocks=warmup_blocks,
                schedule=[["ddpviz" if s == run_id else s, a, b] for s, a, b in ctl.block_log],
                block_spans={side: [[s[r[0]], s[r[-1]]] for r in map(lambda k: block_range(k, block_steps),
                                                                        range(len(s) // block_steps))]
                             for side, s in (("plain", plain_starts), ("ddpviz", ours_starts))},
                max_param_diff=float((plain_params - ours_params).abs().max()),
                backend=plan.backend, device_kind=plan.kind, config=cfg.to_json_dict(),
                source=CUDA_SOURCE if plan.kind == "cuda" else CPU_SOURCE)


CPU_SOURCE = ("measured: rank 0's intervals between step starts, sides taking turns in blocks (ABBA); median "
              "of each round's ddpviz/plain block-median ratio")
CUDA_SOURCE = ("measured: each block's wall time per step, from the turn controller's release to every rank's "
               "'done', sent once the block's GPU work completed (torch.cuda.synchronize at the block's end); "
               "sides taking turns in blocks (ABBA); median of each round's ddpviz/plain ratio")


def block_range(block: int, block_steps: int) -> range:
    """The steps of block `block` (0-based): the one home of a block's step range in this harness."""
    return range(block * block_steps, (block + 1) * block_steps)


def own_step_time(starts: list[float], ends: list[float], marked: dict[str, set[int]], block: int,
                  block_steps: int) -> float | None:
    """The median of ddpviz's own `step_time_s` (`ends` − `starts`, s) over block `block`'s steps that were
    neither memory-traced nor metered (None if none): on CUDA its CUDA events' time from the step's first mark to
    its last, so a block's wall per step well above it is time between steps (the host's, or the GPU waiting for
    it), not inside them."""
    skip = marked["traced"] | marked["metered"]
    own = [ends[i] - starts[i] for i in block_range(block, block_steps) if i < len(starts) and i not in skip]
    return statistics.median(own) if own else None


def untraced_figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The ratio over the rounds whose ddpviz block held no memory-traced step (``ratio_untraced``, its
    ``ratio_untraced_interval_90`` and ``rounds_untraced``), None where every block held one. A run traces
    steps 0-2, every k-th (k >= 200) and its last (`engine.measure.memory_sampler.should_trace_memory`):
    4 of this harness's ~180 steps (0-2 and the last), a few of a long run's thousands, so their share of a
    block here is far above their share of a long run; the other instrumented steps (metered: the first 8,
    then one in 32) are in most blocks. Where blocks are timed by their wall (CUDA), a traced step's extra
    time is in its block's figure."""
    plain = [r["ratio"] for r in rows if not r["ddpviz_traced_steps"]]
    return dict(ratio_untraced=statistics.median(plain) if plain else None,
                ratio_untraced_interval_90=median_interval(plain) if plain else None, rounds_untraced=len(plain))


def block_walls(block_log: list, side: str, block_steps: int) -> list[float]:
    """Per block of `side`, in order: (done - released) / `block_steps`, seconds per step, from the
    turn controller's log (`TurnController.block_log`: (side, released, done), unix s). On CUDA each
    rank says done only after its queued GPU work completed (`engine.measure.turns.settle_gpu`), so
    this counts the GPU's time, where intervals between host step starts count how fast the host
    queued the work (steps ahead of the GPU when nothing synchronises)."""
    return [(done - released) / block_steps for s, released, done in block_log if s == side]
