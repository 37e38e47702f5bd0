"""Recorded real runs (tests/app/data) played into Redis as if a worker had run them."""

from __future__ import annotations

import json
from pathlib import Path

from ddpviz.workers.sink import RedisStreamWriter
from ddpviz.workers.store import RunStatus
from ddpviz.workers.sweeps import submit_sweep, submit_trio

DATA = Path(__file__).parent / "data"
CONFIG = {"world_size": 2, "steps": 12, "width": 256, "bucket_cap_mb": 0.1, "step_delay_s": 0.0,
          "eval_every": 0}
FILES = {"single": "real_single_mlp_ws2.jsonl", "dp": "real_dp_mlp_ws2.jsonl",
         "ddp": "real_ddp_mlp_ws2.jsonl", "ddp-nooverlap": "real_ddp_nooverlap_mlp_ws2.jsonl",
         "ddp-probe": "real_ddp_probe_mlp_ws2.jsonl",  # the same DDP config, with its all-reduce probe
         "fsdp": "real_fsdp_mlp_ws2.jsonl"}


def play(client, run_id: str, name: str, worker: str = "test-worker") -> None:
    """Write a recorded event file into `run_id`'s stream and finish the run like a worker."""
    with open(DATA / name, encoding="utf-8") as fh:
        events = [{**json.loads(line), "run_id": run_id} for line in fh if line.strip()]
    client.store.mark_started(run_id, worker)
    RedisStreamWriter(client.redis, run_id).write_batch(events)
    client.store.finish(run_id, RunStatus.SUCCEEDED, summary=events[-1].get("summary"))


def trio(client, ddp: str = "ddp") -> tuple[str, dict[str, str]]:
    """A single/DP/DDP/FSDP set, finished with the recorded runs (`ddp`: which recorded DDP run,
    a key of FILES). Returns (group, {mode: id})."""
    group, ids = submit_trio(client, CONFIG)
    for mode, rid in ids.items():
        play(client, rid, FILES[ddp if mode == "ddp" else mode])
    return group, ids


def overlap_pair(client) -> tuple[str, dict[bool, str]]:
    """DDP with overlap on and off (one sweep), finished. Returns (sweep id, {overlap: id})."""
    sweep = submit_sweep(client, CONFIG, "overlap", [True, False])
    ids = {}
    for r in client.list_runs():
        if r["group"] == sweep:
            on = r["config"]["overlap"]
            play(client, r["run_id"], FILES["ddp" if on else "ddp-nooverlap"])
            ids[on] = r["run_id"]
    return sweep, ids


# `ddpviz run -- python -m torch.distributed.run --nproc-per-node 2 examples/attach/train_regression.py --epochs 1`
ATTACHED = "real_attached_regression_ws2.jsonl"


def play_attached(client, run_id: str = "attached0regress", edit=None, status=None) -> str:
    """The recorded attached run (`ATTACHED`) stored as `ddpviz run` stores one: a record made by
    `workers.attached.create_record`, its events, its `run_started` kept in the record and the
    config it brings, then its ending (`status`, default succeeded). `edit(event)`, when given, changes each
    event first (a variant of the recording, e.g. a comm hook's). Returns the run id."""
    from ddpviz.workers import keys
    from ddpviz.workers.attached import create_record

    with open(DATA / ATTACHED, encoding="utf-8") as fh:
        events = [{**json.loads(line), "run_id": run_id} for line in fh if line.strip()]
    for e in events if edit else ():
        edit(e)
    started = next(e for e in events if e["type"] == "run_started")
    create_record(client.store, run_id, started["command"], None)
    client.store.save_started(run_id, started)
    RedisStreamWriter(client.redis, run_id).write_batch(events)
    config = {**started["config"], "command": started["command"], "steps": events[-1]["summary"]["steps_done"]}
    client.redis.hset(keys.run(run_id), "config", json.dumps(config))
    client.store.finish(run_id, status or RunStatus.SUCCEEDED, summary=events[-1].get("summary"))
    return run_id


# A real `ddpviz tune` of tests/workers/tune_script/train_tiny.py (its "made_by" says how): the
# report as stored, and the events of round 1's baseline and candidate runs only (the other
# runs it names are not stored, as after the workers' retention deleted them).
TUNE = "real_tune_tiny_ws2.json"


def play_tune(client, spools) -> dict:
    """The recorded tune (`TUNE`) stored as `ddpviz tune --url` stores one: each run from a spool of
    its events through `workers.attached.store_spool`, ended succeeded, then the report
    (`workers.tunes.save_tune`). `spools`: a folder for the spools. Returns the stored report."""
    from ddpviz.workers.attached import store_spool
    from ddpviz.workers.tunes import get_tune, save_tune

    recorded = json.loads((DATA / TUNE).read_text(encoding="utf-8"))
    rep = recorded["report"]
    for run_id, run in recorded["runs"].items():
        spool = Path(spools) / run_id
        spool.mkdir(parents=True)
        (spool / "events-0.jsonl").write_text("".join(json.dumps(e) + "\n" for e in run["events"]))
        ran_at = run["events"][0]["ts"]
        store_spool(client.store, spool, run_id, rep["command"], run["label"], ran_at=ran_at,
                    ending=dict(status="succeeded", error=None, exit_code=0, ended_at=run["events"][-1]["ts"]))
    save_tune(client.redis, rep)
    return get_tune(client.redis, rep["tune_id"])
