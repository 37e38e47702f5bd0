"""Run history: delete a finished run, run a config again, read a whole event stream.

Imports no torch. Records and streams live in Redis (persisted by the server: the embedded one
`ddpviz up` starts writes an append-only file), so history survives a restart of the app and of
Redis; these helpers are the only ways the app changes it besides submitting and cancelling.
"""

from __future__ import annotations

from typing import Any

from rq.exceptions import NoSuchJobError
from rq.job import Job
from rq.serializers import JSONSerializer

from ddpviz.workers import keys
from ddpviz.workers.store import ACTIVE

READ_BATCH = 5000  # events per XRANGE when reading a whole stream


class RunActive(ValueError):
    """The run is queued or started: cancel it before deleting it."""


def delete_run(client, run_id: str) -> bool:
    """Delete a run's record, its index entry, its event stream, its cancel flag and its RQ job.

    Args:
        client: a `workers.client.DdpvizClient`.

    Returns:
        True if there was such a run.

    Raises:
        RunActive: the run is queued or started (a worker may still write to it).
    """
    run = client.get_run(run_id)
    if run is None:
        return False
    if run.get("status") in {s.value for s in ACTIVE}:
        raise RunActive(f"run {run_id} is {run['status']}: cancel it before deleting it")
    with client.redis.pipeline(transaction=True) as pipe:
        pipe.delete(keys.run(run_id), keys.events(run_id), keys.cancel(run_id))
        pipe.zrem(keys.RUNS, run_id)
        pipe.execute()
    try:
        Job.fetch(run_id, connection=client.redis, serializer=JSONSerializer).delete()
    except NoSuchJobError:
        pass  # its result expired, or it never reached RQ
    return True


def rerun(client, run_id: str) -> str:
    """Submit the run's config again (a new run id, same label, no group). Returns the new id.

    Raises:
        KeyError: no run `run_id`.
        engine.config.ConfigError: the stored config no longer validates (e.g. a plugin model
            was uninstalled).
    """
    run = client.get_run(run_id)
    if run is None:
        raise KeyError(f"no run {run_id!r}")
    return client.submit(run["config"], label=run.get("label") or None)


def trimmed_before(head: list[dict[str, Any]]) -> int | None:
    """The first step a run's stream still holds when Redis trimmed its head (`XADD MAXLEN ~`: a stream keeps
    its newest `workers.sink.DEFAULT_STREAM_MAXLEN` events; a 64-device DP run of 300 steps lost steps 0-95, a
    new user 2026-12-06), known by its head holding no `run_started`, which every run writes among its first
    events (not always the first: a pair's "turns" `log` comes before it); else None. `head`: the stream's
    first events, oldest first."""
    if not head or any(e.get("type") == "run_started" for e in head):
        return None
    return min((e["step"] for e in head if isinstance(e.get("step"), int)), default=None)


def read_all_events(client, run_id: str, max_events: int = 2_000_000) -> list[dict[str, Any]]:
    """Every event of the run's stream, oldest first (at most `max_events`). A stream whose head was trimmed
    (`trimmed_before`) gets its `run_started` back from the run's record, which keeps it (`workers.store`), so an
    export still says what ran."""
    return read_history(client, run_id, max_events)[0]


def read_history(client, run_id: str, max_events: int = 2_000_000) -> tuple[list[dict[str, Any]], int | None]:
    """`read_all_events`'s events, and the first step the stream still held when its head was trimmed
    (`trimmed_before`; None when it was not), from one read of the stream."""
    out: list[dict[str, Any]] = []
    last = "0-0"
    while len(out) < max_events:
        batch, last = client.read_events(run_id, after_id=last,
                                         count=min(READ_BATCH, max_events - len(out)))
        out += batch
        if not batch:
            break
    cut = trimmed_before(out[:READ_BATCH])
    if out and cut is not None:
        started = (client.get_run(run_id) or {}).get("started")
        if started:
            out.insert(0, started)
    return out, cut
