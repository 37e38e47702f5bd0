"""Real runs for the bench: a job run here exactly as a worker runs it, events into Redis.

`run_here` stores a run record and calls `workers.jobs.run.run_job`, the body of the RQ job, in this
process (DDP rank processes are spawned as in any run), so the events take the real path to the
run's stream. `stream_entries` reads the stream back with each entry's id, which carries its
arrival time (`workers.bench.latency.arrival_ms`).
"""

from __future__ import annotations

import json
from typing import Any

from ddpviz.workers import keys

READ_CHUNK = 10_000
BENCH_WORKER = "ddpviz-bench"  # the worker name the bench's runs carry

# The Launch page's defaults (engine.config.RunConfig), shortened: what a person first watches.
DEMO_CONFIG: dict[str, Any] = dict(model="mlp", dataset="digits", width=128, depth=3,
                                   global_batch_size=64, world_size=2, device="cpu")


def run_here(redis, config: dict[str, Any], label: str, group: str | None = None) -> tuple[str, str]:
    """Run `config` as a worker would; returns (run_id, final status).

    Raises:
        engine.config.ConfigError: `config` breaks a rule.
    """
    from ddpviz.engine.config import validate_config
    from ddpviz.workers.jobs.run import run_job
    from ddpviz.workers.store import RunStore, new_run_id

    cfg = validate_config(config)
    run_id = new_run_id()
    RunStore(redis).create(run_id, cfg.to_json_dict(), label=label, group=group)
    status = run_job(redis, run_id, worker_name=BENCH_WORKER)
    bench_heartbeat(redis)  # run_job left the worker's hash on the heartbeat's short TTL
    return run_id, status


def stream_entries(redis, run_id: str) -> list[tuple[str, dict[str, Any]]]:
    """Every (entry id, event) of the run's stream, oldest first."""
    out, low = [], "-"
    while True:
        entries = redis.xrange(keys.events(run_id), min=low, max="+", count=READ_CHUNK)
        out += [(i.decode(), json.loads(f[keys.EVENT_FIELD])) for i, f in entries]
        if len(entries) < READ_CHUNK:
            return out
        low = "(" + entries[-1][0].decode()


def stream_bytes(redis, run_id: str) -> int:
    """Bytes Redis uses for the run's stream (MEMORY USAGE ... SAMPLES 0: every node counted)."""
    return int(redis.memory_usage(keys.events(run_id), samples=0) or 0)


def bench_heartbeat(redis, ttl_s: int = 3600) -> None:
    """A heartbeat hash for `BENCH_WORKER`, so readers (`workers.liveness`) do not mark the
    bench's started runs lost while it measures them."""
    import os
    import socket
    import time

    redis.hset(keys.worker(BENCH_WORKER), mapping={"name": BENCH_WORKER, "host": socket.gethostname(),
                                                   "pid": os.getpid(), "ts": repr(time.time())})
    redis.expire(keys.worker(BENCH_WORKER), ttl_s)
