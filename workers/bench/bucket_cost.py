"""`ddpviz bench --bucket-cost`: the host time ddpviz adds per DDP bucket per step, and per step on
small steps against a plain run alone (issue 31), for each `bucket_timing` (`hook`, `recorder`).

The harness is `engine.harness.bucket_cost`: per bucket, the slope of ddpviz's extra step time over
plain torch DDP (taking turns block by block) between a 25 MB cap (1 bucket) and a 0.01 MB cap
(48 buckets) on an MLP 64 wide and 48 deep; per step, whole runs of an MLP 128x3 (batch 64, one
bucket) taking turns with nothing of ddpviz alive on the plain side. 2 gloo ranks on CPU. For the
recorder, also its own per-step work on the training thread, per bucket (`in_thread_cost`: thread CPU
time in one process, which the A/B's noise cannot resolve on 2 shared cores).
"""

from __future__ import annotations

import datetime
import os
from typing import Any

PER_BUCKET = dict(mode="ddp", world_size=2, model="mlp", width=64, depth=48, global_batch_size=32,
                  optimizer="sgd", lr=0.01, dataset="digits", device="cpu")
SMALL_STEP = dict(mode="ddp", world_size=2, model="mlp", width=128, depth=3, global_batch_size=64,
                  optimizer="sgd", lr=0.01, dataset="digits", device="cpu", bucket_cap_mb=25.0, steps=800)
CAPS_MB = (25.0, 0.01)
TARGETS = dict(per_bucket_us=30.0, per_step_ratio=1.03)  # issue 31's, on CPU


def measure_bucket_cost(rounds: int = 5, alone_rounds: int = 6, say=print) -> dict[str, Any]:
    """The record (module docstring): per `bucket_timing`, `per_bucket` (engine.harness.bucket_cost
    `bucket_cost`) and `per_step_alone` (`plain_alone`), with date, machine and load average."""
    from ddpviz.engine.config import RunConfig
    from ddpviz.engine.harness.bucket_cost import bucket_cost, direct_cost, in_thread_cost, plain_alone
    from ddpviz.workers.bench.report import machine

    out: dict[str, Any] = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                               machine=machine(), load_avg_start=os.getloadavg(), targets=TARGETS, timings={})
    for timing in ("hook", "recorder"):
        say(f"bucket cost, bucket_timing={timing} ...")
        per_bucket = bucket_cost(RunConfig(**PER_BUCKET, bucket_timing=timing), CAPS_MB, rounds=rounds,
                                 block_steps=20)
        alone = plain_alone(RunConfig(**SMALL_STEP, bucket_timing=timing), rounds=alone_rounds)
        us = per_bucket["per_bucket_s"] * 1e6
        say(f"  {us:.0f} µs per bucket (90% interval {per_bucket['per_bucket_interval_90'][0] * 1e6:.0f}-"
            f"{per_bucket['per_bucket_interval_90'][1] * 1e6:.0f}); small steps vs plain alone "
            f"{alone['ratio']:.2f}x ({alone['ratio_interval_90'][0]:.2f}-{alone['ratio_interval_90'][1]:.2f}) by the median "
            f"step, {alone['mean_ratio']:.2f}x by the mean (sampled steps included), plain against plain "
            f"{alone['plain_vs_plain']:.2f}x ({alone['plain_vs_plain_interval_90'][0]:.2f}-"
            f"{alone['plain_vs_plain_interval_90'][1]:.2f}: the harness's noise); between steps (the training "
            f"thread's own turn) {alone['between_steps_us']['ddpviz']:.0f} µs against plain's "
            f"{alone['between_steps_us']['plain']:.0f}: {alone['between_steps_share'] * 100:.1f}% of a plain step "
            f"({alone['between_steps_share_interval_90'][0] * 100:.1f}-{alone['between_steps_share_interval_90'][1] * 100:.1f})")
        out["timings"][timing] = dict(per_bucket_us=us, per_bucket=per_bucket, per_step_alone=alone)
        if timing == "recorder":  # its own work on the training thread, which the A/B above cannot resolve
            inner = in_thread_cost(RunConfig(**PER_BUCKET, bucket_timing=timing), CAPS_MB)
            say(f"  its own work on the training thread: {inner['per_bucket_us']:.1f} µs of CPU per bucket, "
                f"{inner['caps'][0]['cpu_us']:.0f} µs a step with {inner['caps'][0]['buckets']} bucket(s)")
            out["timings"][timing]["in_thread"] = inner
            direct = direct_cost(RunConfig(**PER_BUCKET, bucket_timing=timing), CAPS_MB)
            say(f"  its direct cost in the runs: {direct['between_steps_us_per_bucket']:.1f} µs a bucket between steps "
                f"(training thread), {direct['background_us_per_bucket']:.1f} µs of its threads' CPU a bucket")
            out["timings"][timing]["direct"] = direct
    out["load_avg_end"] = os.getloadavg()
    return out
