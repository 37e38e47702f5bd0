"""Figure 7: samples/s of single, DP and DDP on the bench configs, and scaling efficiency.

Each run goes through `engine.run.run_training` with events kept in a list (no Redis), with
`step_delay_s` 0 and evaluation only at the end; samples/s is the run summary's median over steps
after warm-up (engine.summary). Scaling efficiency at world size n (README, Sweeps) is
samples/s(n) / (n · samples/s of one device), one device being the `single` run of the same
world size: one virtual CPU device of `cores // n` threads, as each of the n devices or ranks
gets (engine.components.training.cpu_threads_per_rank). World sizes above the core count are
oversubscribed (each rank still gets one thread) and labelled so.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable

BENCH_CONFIGS: dict[str, dict[str, Any]] = {
    "mlp-digits": dict(model="mlp", width=128, depth=3, global_batch_size=64, steps=60),
    "mlp-deep": dict(model="mlp", width=64, depth=8, global_batch_size=32, steps=60),
    "gpt-text": dict(model="gpt", dataset="text", width=64, depth=4, n_head=4, block_size=64,
                     global_batch_size=16, steps=20, optimizer="adamw", lr=3e-3),
}
SCALING_CONFIG = "mlp-digits"
SUMMARY_KEYS = ("samples_per_s", "step_time_s", "forward_s", "backward_s", "comm_exposed_s",
                "optimizer_s", "overlap", "peak_memory_bytes", "memory_imbalance")


def one_run(name: str, mode: str, world_size: int = 2, steps: int | None = None) -> dict[str, Any]:
    """Run bench config `name` in `mode` here; its summary's figures and the wall time."""
    from ddpviz.engine.config import RunConfig
    from ddpviz.engine.events import ListSink
    from ddpviz.engine.run import run_training

    fields = dict(BENCH_CONFIGS[name], **({"steps": steps} if steps else {}))
    cfg = RunConfig(mode=mode, world_size=world_size, eval_every=0, step_delay_s=0.0, device="cpu",
                    **fields)
    t0 = time.time()
    r = run_training(cfg, ListSink(), f"bench-{name}-{mode}-{world_size}")
    return dict(name=name, mode=mode, world_size=world_size, status=r.status,
                wall_s=round(time.time() - t0, 2), **{k: r.summary.get(k) for k in SUMMARY_KEYS})


def efficiency(samples_per_s: float | None, world_size: int, single_per_s: float | None) -> float | None:
    """samples/s(n) / (n · samples/s of one device); None when either is missing."""
    if not samples_per_s or not single_per_s or world_size < 1:
        return None
    return samples_per_s / (world_size * single_per_s)


def measure_throughput(names: list[str], steps: int | None, world_sizes: list[int],
                       say: Callable[[str], None] = lambda m: print(m, file=sys.stderr)) -> dict[str, Any]:
    """Every config in every mode at world size 2, then single, DP and DDP of `SCALING_CONFIG`
    at each of `world_sizes` (runs at world size 2 are reused)."""
    results = []
    for name in names:
        for mode in ("single", "dp", "ddp"):
            say(f"  throughput {name} {mode}")
            results.append(one_run(name, mode, 2, steps))
    cores = os.cpu_count() or 1
    points = []
    for n in world_sizes:
        runs = {}
        for mode in ("single", "dp", "ddp"):
            runs[mode] = next((r for r in results if r["name"] == SCALING_CONFIG and r["mode"] == mode
                               and r["world_size"] == n), None)
            if runs[mode] is None:
                say(f"  scaling {SCALING_CONFIG} {mode} world_size {n}")
                runs[mode] = one_run(SCALING_CONFIG, mode, n, steps)
        one = runs["single"]["samples_per_s"]
        for mode in ("dp", "ddp"):
            r = runs[mode]
            points.append(dict(mode=mode, world_size=n, samples_per_s=r["samples_per_s"],
                               single_samples_per_s=one, status=r["status"],
                               efficiency=_round(efficiency(r["samples_per_s"], n, one)),
                               oversubscribed=n > cores))
    return {"results": results, "scaling": {"config": SCALING_CONFIG, "cores": cores,
                                            "points": points}}


def _round(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)
