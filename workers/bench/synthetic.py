"""Synthetic finished runs of a given number of events, stored as a worker stores real ones.

Events follow docs/events.md with the shapes of a 2-device CPU run of the default mlp: DDP emits
per rank and step a `step`, three `bucket`s, a `memory` and a `comm_volume` event (12 per step);
DP a `step` and, per device, its phases, a `memory` and a `comm_volume` (20 per step); single a
`step` and a `memory` (2 per step); every run an `eval` every 25 steps. Used for the app's data
path (figure 4) and Redis growth (figure 8), where what matters is how many events a run holds,
not what trained them.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from ddpviz.workers.bench.runs import BENCH_WORKER
from ddpviz.workers.sink import RedisStreamWriter
from ddpviz.workers.store import RunStatus, RunStore

WORLD = 2
BUCKETS = 3
EVENTS_PER_STEP = {"ddp": WORLD * (3 + BUCKETS), "dp": 1 + WORLD * 10 - 1, "single": 2}
PHASES = [("broadcast", 0, 3), ("scatter", 3, 5), ("forward", 5, 11), ("gather", 11, 13),
          ("loss", 13, 14), ("backward", 14, 24), ("reduce", 24, 28), ("optimizer", 28, 32)]
MIB = 1024 * 1024
WRITE_BATCH = 5000


def config(mode: str, steps: int) -> dict[str, Any]:
    return {"mode": mode, "world_size": WORLD if mode != "single" else 1, "device": "cpu",
            "backend": "auto", "model": "mlp", "dataset": "digits", "width": 128, "depth": 3,
            "global_batch_size": 64, "steps": steps, "lr": 0.05, "optimizer": "sgd", "seed": 0,
            "bucket_cap_mb": 25.0, "overlap": True, "eval_every": 25, "step_delay_s": 0.0}


def _started(run_id: str, mode: str, steps: int, t0: float) -> dict[str, Any]:
    n = WORLD if mode != "single" else 1
    layout = [{"bucket_index": b, "nbytes": 40960 * (b + 1), "num_params": 2,
               "param_names": [f"net.{2 * b}.weight", f"net.{2 * b}.bias"]} for b in range(BUCKETS)]
    extra = {"bucket_preview": {"initial": [{"bucket_index": 0, "nbytes": 245760, "num_params": 6,
                                             "param_names": []}], "rebuilt": layout,
                                "first_bucket_cap_bytes": 1048576, "bucket_cap_bytes": 26214400}} \
        if mode == "ddp" else {}
    return {"type": "run_started", "run_id": run_id, "ts": t0, "rank": 0, "device": "cpu:0",
            "schema_version": 1, "config": config(mode, steps), "mode": mode, "world_size": n,
            "backend": "gloo" if mode == "ddp" else None,
            "devices": [{"name": f"cpu:{i}", "kind": "cpu", "total_memory_bytes": None}
                        for i in range(n)], "device_names": [f"cpu:{i}" for i in range(n)],
            "emulated": mode == "dp", "torch_version": "2.13.0", "host": "bench",
            "param_count": 61450, "grad_bytes": 245800, "micro_batch_per_device": 64 // n, **extra}


def _step(run_id: str, rank: int, step: int, ts: float) -> dict[str, Any]:
    return {"type": "step", "run_id": run_id, "ts": ts, "rank": rank, "device": f"cpu:{rank}",
            "step": step, "loss": 2.3 / (1 + step / 500), "samples": 64, "step_time_s": 0.0021,
            "forward_s": 0.0005, "backward_s": 0.0008, "comm_exposed_s": 0.0002,
            "optimizer_s": 0.0003, "samples_per_s": 30476.2, "start_ts": ts - 0.0021,
            "backward_start_ts": ts - 0.0014}


def _per_device(run_id: str, rank: int, device: int, step: int, ts: float, sent: int) -> list[dict]:
    base = {"run_id": run_id, "ts": ts, "rank": rank, "device": f"cpu:{device}", "step": step}
    return [{"type": "memory", **base, "allocated_bytes": 2 * MIB + 4096 * (step % 50),
             "reserved_bytes": 3 * MIB, "used_bytes": None, "source": "accounted",
             "breakdown": {"params": 245800, "grads": 245800, "activations": 65536},
             "peak_allocated_bytes": 3 * MIB},
            {"type": "comm_volume", **base, "sent_bytes": sent, "recv_bytes": sent,
             "theory_sent_bytes": sent, "theory_recv_bytes": sent}]


def step_events(run_id: str, mode: str, step: int, ts: float) -> list[dict[str, Any]]:
    """The events of one step of a `mode` run (see the module docstring for the mix)."""
    if mode == "single":
        return [_step(run_id, 0, step, ts), _per_device(run_id, 0, 0, step, ts, 0)[0]]
    if mode == "ddp":
        out = []
        for r in range(WORLD):
            out.append(_step(run_id, r, step, ts))
            for b in range(BUCKETS):
                ready = 0.0003 * (b + 1)
                out.append({"type": "bucket", "run_id": run_id, "ts": ts, "rank": r, "device": f"cpu:{r}",
                            "step": step, "bucket_index": b, "nbytes": 40960 * (b + 1), "num_params": 2,
                            "ready_s": ready, "comm_start_s": ready + 1e-5,
                            "comm_end_s": ready + 0.0002 * (b + 1), "is_last": b == BUCKETS - 1})
            out += _per_device(run_id, r, r, step, ts, 245800)
        return out
    out = [_step(run_id, 0, step, ts)]
    for d in range(WORLD):
        for phase, a, b in PHASES:
            if phase == "optimizer" and d > 0:
                continue
            out.append({"type": "dp_phase", "run_id": run_id, "ts": ts, "rank": 0, "device": f"cpu:{d}",
                        "step": step, "phase": phase, "start_s": a / 1e4, "end_s": b / 1e4,
                        "nbytes": 245800 if phase in ("broadcast", "reduce") else 0})
        out += _per_device(run_id, 0, d, step, ts, 245800 * (WORLD - 1) if d == 0 else 245800)
    return out


def run_events(run_id: str, mode: str, n_events: int, t0: float) -> list[dict[str, Any]]:
    """About `n_events` events: run_started, whole steps (with evals), run_finished."""
    steps = max(1, (n_events - 2) // EVENTS_PER_STEP[mode])
    out = [_started(run_id, mode, steps, t0)]
    for s in range(steps):
        ts = t0 + 1 + s * 0.003
        out += step_events(run_id, mode, s, ts)
        if (s + 1) % 25 == 0:
            out.append({"type": "eval", "run_id": run_id, "ts": ts, "rank": 0, "step": s,
                        "val_loss": 2.0, "val_accuracy": 0.5})
    out.append({"type": "run_finished", "run_id": run_id, "ts": t0 + 2 + steps * 0.003,
                "rank": 0, "status": "succeeded", "error": None, "summary": summary(steps)})
    return out


def summary(steps: int) -> dict[str, Any]:
    return {"steps_done": steps, "samples_per_s": 30476.2, "step_time_s": 0.0021, "forward_s": 0.0005,
            "backward_s": 0.0008, "comm_exposed_s": 0.0002, "optimizer_s": 0.0003, "overlap": 0.5,
            "final_loss": 1.0, "replicas_in_sync": True, "peak_memory_bytes": {"cpu:0": 3 * MIB}}


def store_run(redis, mode: str, n_events: int, *, group: str | None = None,
              status: RunStatus = RunStatus.SUCCEEDED, label: str | None = None) -> str:
    """Store a synthetic `mode` run of about `n_events` events; returns its id. With status
    STARTED the run stays open (its final event is left out), so readers keep polling it."""
    run_id = f"bench{uuid.uuid4().hex[:11]}"
    events = run_events(run_id, mode, n_events, time.time())
    store = RunStore(redis)
    store.create(run_id, config(mode, events[0]["config"]["steps"]), label=label or mode.upper(),
                 group=group)
    store.mark_started(run_id, BENCH_WORKER)
    if status is not RunStatus.STARTED:
        store.finish(run_id, status, summary=events[-1]["summary"])
    else:
        events = events[:-1]
    writer = RedisStreamWriter(redis, run_id)
    for i in range(0, len(events), WRITE_BATCH):
        writer.write_batch(events[i:i + WRITE_BATCH])
    return run_id


def store_open_run(redis, mode: str, steps: int, label: str | None = None) -> str:
    """A started `mode` run of `steps` steps holding only its `run_started` (a feeder appends
    `step_events` later); returns its id."""
    run_id = f"bench{uuid.uuid4().hex[:11]}"
    store = RunStore(redis)
    store.create(run_id, config(mode, steps), label=label or mode.upper())
    store.mark_started(run_id, BENCH_WORKER)
    RedisStreamWriter(redis, run_id).write_batch([_started(run_id, mode, steps, time.time())])
    return run_id
