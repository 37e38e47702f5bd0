"""Figure 5b: step time of ddpviz's instrumented DDP over plain torch DDP on the same work.

The harness is `engine.harness.overhead.measure_overhead` (a plain DDP loop — PyTorch's built-in
all-reduce, no hook, no events — and `ddpviz` DDP on the same config, data order, batch and
threads, running at once and taking turns block by block; the median over rounds of each round's
ratio of block-median step intervals). This module only turns the bench's config dicts (with
their `block_steps`) into a validated `RunConfig` and adds the per-event emit cost (a real run's
events, `emit_cost`) and the GIL meter's reading cost (`gil_reading_cost_us`).
"""

from __future__ import annotations

import time
from typing import Any


def measure_overhead(config: dict[str, Any], rounds: int) -> dict[str, Any]:
    """`engine.harness.overhead.measure_overhead` on the DDP config dict `config` (validated first).

    Raises:
        engine.config.ConfigError: `config` breaks a field's rule (named in the error).
    """
    from ddpviz.engine.config import validate_config
    from ddpviz.engine.harness.overhead import DEFAULT_BLOCK_STEPS
    from ddpviz.engine.harness.overhead import measure_overhead as measure

    config = dict(config)
    block_steps = config.pop("block_steps", DEFAULT_BLOCK_STEPS)
    cfg = validate_config({**config, "mode": "ddp", "step_delay_s": 0.0, "eval_every": 0})
    return {"harness": "ddpviz.engine.harness.overhead.measure_overhead", **measure(cfg, rounds, block_steps=block_steps)}


EMIT_REPEATS = 200  # the recorded run's events are emitted this many times over
EMIT_SOURCE = ("measured: a real 2-rank gloo DDP run's events (3 steps of mlp 32x2, 3 buckets a step, "
               "their step, bucket, gil, comm_volume, memory and run events as emitted), re-emitted by "
               "Telemetry.emit into BatchingSink(JsonlWriter(a temp file)); loop = the emit calls, "
               "with_write = until close() wrote them all (the writer thread shares the GIL on CPU)")


def recorded_events() -> list[dict[str, Any]]:
    """The events of a short real DDP run (2 gloo ranks, 3 steps), as its ranks emitted them."""
    from ddpviz.engine.config import RunConfig
    from ddpviz.engine.events import ListSink
    from ddpviz.engine.run import run_training

    sink = ListSink()
    cfg = RunConfig(mode="ddp", world_size=2, model="mlp", width=32, depth=2, global_batch_size=16, steps=3,
                    eval_every=0, step_delay_s=0.0, bucket_cap_mb=0.005, probe=False)
    result = run_training(cfg, sink, "bench-emit")
    if result.status != "succeeded":
        raise RuntimeError(f"the recorded run failed: {result.error}")
    return list(sink.events)


def emit_cost(events: list[dict[str, Any]], repeats: int = EMIT_REPEATS) -> dict[str, Any]:
    """Microseconds per event the training loop spends emitting `events` (each re-emitted with its
    own type and fields through `Telemetry.emit`, `repeats` times), alone (`loop_us_per_event`) and
    with the writer thread's encoding and file writes (`with_write_us_per_event`), plus the mix of
    types and the mean encoded size (bytes). Source: EMIT_SOURCE."""
    import tempfile

    from ddpviz.engine.events import JsonlWriter, encode_json
    from ddpviz.engine.batching import BatchingSink
    from ddpviz.engine.measure.telemetry import Telemetry

    drop = {"type", "run_id", "ts"}
    calls = [(e["type"], {k: v for k, v in e.items() if k not in drop}) for e in events]
    with tempfile.TemporaryDirectory(prefix="ddpviz-emit-") as tmp:
        sink = BatchingSink(JsonlWriter(f"{tmp}/events.jsonl"))
        tel = Telemetry(sink, "bench-emit")
        t0 = time.perf_counter()
        for _ in range(repeats):
            for type_, fields in calls:
                tel.emit(type_, **fields)
        loop_s = time.perf_counter() - t0
        sink.close()
        write_s = time.perf_counter() - t0
    n = repeats * len(calls)
    mix: dict[str, int] = {}
    for type_, _ in calls:
        mix[type_] = mix.get(type_, 0) + 1
    return {"loop_us_per_event": round(loop_s / n * 1e6, 3), "with_write_us_per_event": round(write_s / n * 1e6, 3),
            "events": n, "mix": mix, "mean_bytes": round(sum(len(encode_json(e)) for e in events) / len(events)),
            "source": EMIT_SOURCE}


def gil_reading_cost_us() -> float:
    """Microseconds per `ThreadClocks.read()` (the GIL meter's reading; a span is two), measured here."""
    from ddpviz.engine.measure.gil import ThreadClocks

    return round(ThreadClocks.cost_us(), 3)
