"""What the instrument costs: plain torch DDP against ddpviz's instrumented DDP on the same work.

`measure_overhead(cfg)` runs, in alternating rounds, (a) a plain DDP loop — PyTorch's built-in
all-reduce, no comm hook, no events, no per-step synchronisation — in rank processes of its own,
and (b) `ddpviz` DDP (`engine.run.run_training`, mode ddp) with the same model, seed, data
shards, batch, optimizer, bucket cap, backend and threads. Each side's step time is the interval
between consecutive step starts on rank 0 (ddpviz: `start_ts` of its `step` events; the last step
ends at `start_ts + step_time_s`; plain: `time.perf_counter()` at each step start, the last one
after a final synchronize), so both include whatever runs between steps. The first `warmup`
steps are dropped; per round the median interval is taken; the ratio is the median over rounds of
ddpviz's over the median over rounds of plain. Alternating the order each round cancels slow
drift of the machine (issue 9 saw single rounds range 0.96-1.43x on a busy CPU).

Also returned: the largest parameter difference between the two sides' final parameters (0 up to
float rounding when both did the same work), so a ratio is never reported for different work.
Works on CPU (gloo) and CUDA (NCCL, world_size <= GPUs).
"""

from __future__ import annotations

import contextlib
import json
import statistics
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from engine.config import RunConfig

OVERHEAD_WARMUP_STEPS = 5  # steps dropped from each side (first-step allocations, DDP's bucket rebuild)


def _plain_rank(rank: int, cfg_dict: dict, backend: str, device_kind: str, init_file: str,
                out_dir: str) -> None:
    """One rank of the plain loop (torch.multiprocessing spawn target)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from engine.buckets import ddp_bucket_cap_arg
    from engine.data import BatchPlan, load_dataset
    from engine.models import build_model
    from engine.training import autocast, cpu_threads_per_rank, flat_params, loss_fn, make_optimizer

    cfg = RunConfig(**cfg_dict)
    world, accum = cfg.world_size, cfg.grad_accum_steps
    if device_kind == "cuda":
        torch.cuda.set_device(rank)
        device = torch.device(f"cuda:{rank}")
    else:
        torch.set_num_threads(cpu_threads_per_rank(world))
        device = torch.device("cpu")
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=cfg.collective_timeout_s))
    try:
        ds = load_dataset(cfg)
        model = build_model(cfg, ds).to(device).train()
        ddp = DDP(model, device_ids=[rank] if device_kind == "cuda" else None,
                  bucket_cap_mb=ddp_bucket_cap_arg(cfg), gradient_as_bucket_view=cfg.gradient_as_bucket_view,
                  static_graph=cfg.static_graph, find_unused_parameters=cfg.find_unused_parameters)
        opt = make_optimizer(cfg, ddp.parameters())
        plan = BatchPlan(len(ds), world, cfg.micro_batch_per_device, cfg.seed)
        starts = []
        for step in range(cfg.steps):
            starts.append(time.perf_counter())
            for micro in range(accum):
                idx = plan.rank_indices(step * accum + micro, rank)
                x, y = ds.x_train[idx].to(device), ds.y_train[idx].to(device)
                with contextlib.nullcontext() if micro == accum - 1 else ddp.no_sync():
                    with autocast(cfg, device.type):
                        loss = loss_fn(ddp(x), y) / accum
                    loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=not cfg.gradient_as_bucket_view)
        if device_kind == "cuda":
            torch.cuda.synchronize(device)
        starts.append(time.perf_counter())
        if rank == 0:
            Path(out_dir, "plain.json").write_text(json.dumps({"step_starts": starts}))
            torch.save(flat_params(model), Path(out_dir, "plain_params.pt"))
    finally:
        dist.destroy_process_group()


def plain_ddp_step_starts(cfg: RunConfig, backend: str, device_kind: str) -> tuple[list[float], torch.Tensor]:
    """Run the plain loop in `cfg.world_size` spawned processes.

    Returns:
        (rank 0's step start times in seconds, the last one being the end of the last step;
        rank 0's final parameters, flat on CPU).

    Raises:
        torch.multiprocessing.ProcessRaisedException: a rank failed (its traceback included).
    """
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="ddpviz-overhead-") as tmp:
        mp.start_processes(_plain_rank, args=(cfg.to_json_dict(), backend, device_kind, f"{tmp}/pg", tmp),
                           nprocs=cfg.world_size, join=True, start_method="spawn")
        starts = json.loads(Path(tmp, "plain.json").read_text())["step_starts"]
        return starts, torch.load(Path(tmp, "plain_params.pt"))


def ddpviz_step_starts(cfg: RunConfig) -> tuple[list[float], torch.Tensor]:
    """Run `cfg` as ddpviz DDP; rank 0's step starts (unix s, plus the end of the last step) and
    final parameters.

    Raises:
        RuntimeError: the run did not succeed (its error included).
    """
    from engine.events import ListSink
    from engine.run import run_training

    sink = ListSink()
    result = run_training(cfg, sink, f"overhead-{uuid.uuid4().hex[:8]}")
    if result.status != "succeeded":
        raise RuntimeError(f"ddpviz DDP run {result.status}: {(result.error or {}).get('exception')}")
    steps = sorted((e for e in sink.of_type("step") if e.get("rank", 0) == 0), key=lambda e: e["step"])
    return [e["start_ts"] for e in steps] + [steps[-1]["start_ts"] + steps[-1]["step_time_s"]], \
        result.final_params


def step_stats(step_starts: list[float], warmup: int) -> dict[str, float]:
    """Median and mean interval (s) between consecutive step starts, after `warmup` steps.

    Raises:
        ValueError: fewer than 2 steps are left after the warm-up.
    """
    intervals = [b - a for a, b in zip(step_starts, step_starts[1:])][warmup:]
    if len(intervals) < 2:
        raise ValueError(f"steps must leave at least 2 steps after {warmup} warm-up steps "
                         f"(got {len(step_starts) - 1} steps)")
    return dict(median_step_s=statistics.median(intervals), mean_step_s=statistics.fmean(intervals),
                steps=len(intervals))


def measure_overhead(cfg: RunConfig, rounds: int = 3, warmup: int = OVERHEAD_WARMUP_STEPS) -> dict[str, Any]:
    """Plain vs ddpviz DDP on `cfg` (mode forced to ddp, no step delay, evaluation only at the end).

    Returns:
        JSON-able dict: ``ratio`` (ddpviz / plain median step time), ``plain_median_step_s``,
        ``ddpviz_median_step_s`` (medians over rounds), ``rounds`` (each side's stats and the
        round's ratio, in the order run), ``max_param_diff`` (final parameters, plain vs ddpviz),
        ``backend``, ``device_kind``, ``config``, ``source``.

    Raises:
        ValueError: `rounds` < 1, nnodes > 1, or too few steps after the warm-up.
    """
    from engine.devices import resolve_plan

    if rounds < 1:
        raise ValueError(f"rounds must be >= 1 (got {rounds})")
    if cfg.nnodes != 1:
        raise ValueError(f"nnodes must be 1 for the overhead measurement (got {cfg.nnodes})")
    if cfg.steps < warmup + 3:
        raise ValueError(f"steps must be >= warmup + 3 = {warmup + 3} (got {cfg.steps})")
    cfg = cfg.model_copy(update=dict(mode="ddp", step_delay_s=0.0, eval_every=0))
    plan = resolve_plan(cfg)
    out: list[dict[str, Any]] = []
    params: dict[str, torch.Tensor] = {}
    for r in range(rounds):
        got: dict[str, Any] = {}
        for side in ("plain", "ddpviz") if r % 2 == 0 else ("ddpviz", "plain"):
            starts, params[side] = plain_ddp_step_starts(cfg, plan.backend, plan.kind) if side == "plain" \
                else ddpviz_step_starts(cfg)
            got[side] = step_stats(starts, warmup)
        got["ratio"] = got["ddpviz"]["median_step_s"] / got["plain"]["median_step_s"]
        out.append(got)
    plain = statistics.median(r["plain"]["median_step_s"] for r in out)
    ours = statistics.median(r["ddpviz"]["median_step_s"] for r in out)
    return dict(ratio=ours / plain, plain_median_step_s=plain, ddpviz_median_step_s=ours, rounds=out,
                max_param_diff=float((params["plain"] - params["ddpviz"]).abs().max()),
                backend=plan.backend, device_kind=plan.kind, warmup_steps=warmup, config=cfg.to_json_dict(),
                source="measured: rank 0's intervals between step starts, median after warm-up, "
                       "alternating rounds")
