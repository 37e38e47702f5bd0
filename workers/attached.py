"""An attached run's record in Redis (`ddpviz run`, `ddpviz upload`): created started, ended with
its status, error and a summary built from its stream, and its failure read from torchrun's error
file (torch.distributed.elastic writes the failing rank's exception and traceback to
TORCHELASTIC_ERROR_FILE, `error.json` in the run's spool folder).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


def failure(spool: Path, exit_code: int) -> dict[str, Any]:
    """The run's error: the first failing rank's exception and traceback from torchrun's error
    file, else the exit code."""
    from ddpviz.workers.spool import read_json
    from ddpviz.workers.store import make_error

    doc = read_json(spool / "error.json") or {}
    msg = doc.get("message")
    if isinstance(msg, dict):
        extra = msg.get("extraInfo") or {}
        err = make_error(msg.get("message") or f"exit code {exit_code}", extra.get("py_callstack"),
                         rank=extra.get("rank"), stage="training")
    elif isinstance(msg, str):
        err = make_error(msg, None, stage="training")
    else:
        err = make_error(f"CommandFailed: the command exited with code {exit_code}", None, stage="training")
    err["exit_code"] = exit_code
    return err


def create_record(store: Any, run_id: str, cmd: list[str] | None, label: str | None,
                  worker: str | None = None, ran_at: float | None = None) -> None:
    """A started run record for an attached run, config ``{mode, attached, command}`` until rank
    0's `run_started` brings the rest. `worker`: the launcher's heartbeat name
    (`keys.attach_launcher`), by which a killed launcher's run is judged lost; None (`ddpviz
    upload` of a spool) leaves nothing to judge by. `ran_at` (unix s): when the run started, for
    a run stored after it ran (`ddpviz upload`: the spool's `meta.json` `created_at`); its record's
    created and started times are then that moment, not the upload's (issue 33)."""
    from ddpviz.workers import keys
    from ddpviz.workers.store import RunStatus

    store.create(run_id, {"mode": "ddp", "attached": True, "command": cmd}, label=label)
    when = time.time() if ran_at is None else float(ran_at)
    store.transition(run_id, RunStatus.STARTED, allowed_from=[RunStatus.QUEUED],
                     fields={"started_at": repr(when), **({"worker": worker} if worker else {})},
                     also=lambda pipe: pipe.sadd(keys.STARTED, run_id))
    if ran_at is not None:  # the history lists runs by when they were made: when this one ran
        store.redis.hset(keys.run(run_id), "created_at", repr(when))
        store.redis.zadd(keys.RUNS, {run_id: when})


def stream_summary(store: Any, run_id: str) -> dict[str, Any]:
    """The run's summary from every event in its stream (every node's, for `--join`ed launchers)."""
    from ddpviz.engine.summary import SummaryBuilder
    from ddpviz.workers.client import DdpvizClient
    from ddpviz.workers.history import read_all_events

    builder = SummaryBuilder()
    for event in read_all_events(DdpvizClient(redis=store.redis), run_id):
        builder.observe(event)
    return builder.summary()


def _store_steps(store: Any, run_id: str, rec: dict[str, Any]) -> dict[str, Any]:
    """The run's summary from its stream; its step count written into the record's config."""
    from ddpviz.workers import keys

    summary = stream_summary(store, run_id)
    config = {**(rec.get("config") or {}), "steps": summary.get("steps_done")}
    store.redis.hset(keys.run(run_id), "config", json.dumps(config))
    return summary


def refresh_summary(store: Any, run_id: str) -> None:
    """Rebuild an ended run's summary from its stream (a joined node's last events came after
    node 0 recorded the ending)."""
    from ddpviz.workers import keys
    from ddpviz.workers.store import TERMINAL

    rec = store.get(run_id) or {}
    if rec.get("status") in {s.value for s in TERMINAL}:
        summary = _store_steps(store, run_id, rec)
        store.redis.hset(keys.run(run_id), "summary", json.dumps(summary))


def record_ending(store: Any, run_id: str, ending: dict) -> bool:
    """Set the run's terminal status, error and summary (from its stream, with a `run_finished`
    event), and its config's step count; its end time is the ending's `ended_at` (unix s, when the
    command ended) where it has one. True if this call ended it."""
    from ddpviz.workers import keys
    from ddpviz.workers.store import RunStatus

    summary = _store_steps(store, run_id, store.get(run_id) or {})
    done = store.finish(run_id, RunStatus(ending["status"]), error=ending["error"], summary=summary,
                        append_event=True, allowed_from=[RunStatus.STARTED, RunStatus.QUEUED])
    if done and ending.get("ended_at"):  # when the command ended (`ddpviz run`'s clock), not now
        store.redis.hset(keys.run(run_id), "finished_at", repr(float(ending["ended_at"])))
    return done


def store_spool(store: Any, spool: Path, run_id: str, cmd: list[str] | None, label: str | None,
                ran_at: float | None = None, ending: dict | None = None, joined: bool = False) -> None:
    """Store the events of `spool` not yet stored as run `run_id` (its record created first when
    missing, `create_record`), then its ending when given (`record_ending`; a `joined` node's
    launcher records only a failure, node 0's ends the run). What was sent is kept in the spool's
    `sent.json` (`workers.spool.SpoolForwarder`), so a second call sends only the rest.

    Raises:
        redis.RedisError, OSError: Redis stopped answering; the ending is then not recorded.
    """
    from ddpviz.workers.spool import SpoolForwarder

    if not store.exists(run_id):
        create_record(store, run_id, cmd, label, ran_at=ran_at)
    fwd = SpoolForwarder(spool, run_id, store)
    if not fwd.pump(final=True):
        raise fwd.redis_error or OSError(f"{spool}: not every event could be stored")
    if ending and (not joined or ending["status"] == "failed"):
        record_ending(store, run_id, ending)
    elif ending:
        refresh_summary(store, run_id)
