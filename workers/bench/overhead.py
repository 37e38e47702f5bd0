"""Figure 5b: step time of ddpviz's instrumented DDP over plain torch DDP on the same work.

`engine.overhead` (issue 9's `ddpviz bench --overhead`) is used when it exists. Until then this
module's minimal harness: rounds alternate a plain DDP run (`plain_rank`: torch's DDP with its
built-in all-reduce, no hook, no events, no sampled extras) and `ddpviz train --mode ddp`'s path
(`engine.run.run_training`, events into a list) on the same config, data order, batch and
threads per rank. Each round gives a median step time per side (rank 0, warm-up steps skipped);
the figure is the median over rounds of instrumented / plain. Both sides time the same span:
indexing the batch, forward, backward (with its all-reduce), optimizer step and zero_grad.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

WARMUP_STEPS = 5
OVERHEAD_FUNC = "measure_overhead"  # engine.overhead: (config dict, rounds) -> {"ratio", ...}


def plain_rank(rank: int, world: int, cfg_dict: dict, init_file: str, out: str) -> None:
    """One rank of plain torch DDP (spawned by `torch.multiprocessing.spawn`): writes its step
    times (seconds) to `out` + rank."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from engine.buckets import ddp_bucket_cap_arg
    from engine.config import RunConfig
    from engine.data import BatchPlan, load_dataset
    from engine.models import build_model
    from engine.training import cpu_threads_per_rank, loss_fn, make_optimizer

    cfg = RunConfig(**cfg_dict)
    torch.set_num_threads(cpu_threads_per_rank(world))
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    ds = load_dataset(cfg)
    model = build_model(cfg, ds).train()
    ddp = DDP(model, bucket_cap_mb=ddp_bucket_cap_arg(cfg))
    opt = make_optimizer(cfg, ddp.parameters())
    plan = BatchPlan(len(ds), world, cfg.micro_batch_per_device, cfg.seed)
    times = []
    for step in range(cfg.steps):
        t0 = time.perf_counter()
        idx = plan.rank_indices(step, rank)
        x, y = ds.x_train[idx], ds.y_train[idx]
        loss_fn(ddp(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    Path(f"{out}{rank}").write_text(json.dumps(times))
    dist.destroy_process_group()


def _plain_median_s(cfg_dict: dict) -> float:
    import torch.multiprocessing as tmp

    world = cfg_dict["world_size"]
    with tempfile.TemporaryDirectory(prefix="ddpviz-plain-") as wd:
        out = os.path.join(wd, "times")
        tmp.spawn(plain_rank, args=(world, cfg_dict, os.path.join(wd, "init"), out), nprocs=world)
        times = json.loads(Path(f"{out}0").read_text())
    return statistics.median(times[WARMUP_STEPS:])


def _ddpviz_median_s(cfg_dict: dict) -> float:
    from engine.config import RunConfig
    from engine.events import ListSink
    from engine.run import run_training

    sink = ListSink()
    result = run_training(RunConfig(**cfg_dict), sink, f"bench-overhead-{int(time.time())}")
    if result.status != "succeeded":
        raise RuntimeError(f"instrumented run {result.status}: {result.error}")
    times = [e["step_time_s"] for e in sink.of_type("step")
             if e.get("rank") == 0 and e["step"] >= WARMUP_STEPS]
    return statistics.median(times)


def measure_overhead(config: dict[str, Any], rounds: int) -> dict[str, Any]:
    """Median over `rounds` of (instrumented median step time / plain median step time).

    `config` is a DDP RunConfig dict (world_size ranks, gloo on CPU); `step_delay_s` and
    evaluation are turned off so both sides do the same work.
    """
    try:
        from engine import overhead as engine_overhead  # the measured-memory issue's harness

        fn = getattr(engine_overhead, OVERHEAD_FUNC, None)
    except ImportError:
        fn = None
    if fn is not None:
        return {"harness": f"engine.overhead.{OVERHEAD_FUNC}", **fn(config, rounds)}
    from engine.config import validate_config

    cfg = validate_config({**config, "mode": "ddp", "step_delay_s": 0.0, "eval_every": 0,
                           "device": "cpu"}).to_json_dict()
    plain, inst = [], []
    for _ in range(rounds):
        plain.append(_plain_median_s(cfg))
        inst.append(_ddpviz_median_s(cfg))
    ratios = [i / p for i, p in zip(inst, plain)]
    return {"harness": "workers.bench.overhead (alternating whole runs)",
            "ratio": round(statistics.median(ratios), 3),
            "ratios": [round(r, 3) for r in ratios],
            "plain_step_ms": [round(p * 1e3, 3) for p in plain],
            "ddpviz_step_ms": [round(i * 1e3, 3) for i in inst],
            "config": {k: cfg[k] for k in ("model", "width", "depth", "global_batch_size", "steps",
                                           "bucket_cap_mb", "world_size")}}


EMIT_EVENTS = 20_000


def emit_cost_us() -> float:
    """Microseconds the training loop spends per emitted event (`BatchingSink.emit` + make_event)."""
    from engine.events import BatchingSink, ListSink, make_event

    sink = BatchingSink(ListSink())
    t0 = time.perf_counter()
    for i in range(EMIT_EVENTS):
        sink.emit(make_event("step", "bench", step=i, loss=0.0))
    emit_s = time.perf_counter() - t0
    sink.close()
    return round(emit_s / EMIT_EVENTS * 1e6, 3)
