"""Figure 5b: step time of ddpviz's instrumented DDP over plain torch DDP on the same work.

The harness is `engine.harness.overhead.measure_overhead` (a plain DDP loop — PyTorch's built-in
all-reduce, no hook, no events — and `ddpviz` DDP on the same config, data order, batch and
threads, running at once and taking turns block by block; the median over rounds of each round's
ratio of block-median step intervals). This module only turns the bench's config dicts (with
their `block_steps`) into a validated `RunConfig` and adds the per-event emit cost.
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


EMIT_EVENTS = 20_000


def emit_cost_us() -> float:
    """Microseconds the training loop spends per emitted event (`BatchingSink.emit` + make_event)."""
    from ddpviz.engine.events import BatchingSink, ListSink, make_event

    sink = BatchingSink(ListSink())
    t0 = time.perf_counter()
    for i in range(EMIT_EVENTS):
        sink.emit(make_event("step", "bench", step=i, loss=0.0))
    emit_s = time.perf_counter() - t0
    sink.close()
    return round(emit_s / EMIT_EVENTS * 1e6, 3)
