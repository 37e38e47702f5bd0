"""``ddpviz upload SPOOL``: send an attached run's spooled events to Redis (when `ddpviz run` could
not), record how it ended, and remove the spool once everything is stored (`workers.spool`)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import redis

from ddpviz.workers.attached import store_spool
from ddpviz.workers.cli.exits import EXIT_FAILED, EXIT_OK, EXIT_REFUSED


def _say(message: str) -> None:
    print(f"ddpviz: {message}", file=sys.stderr, flush=True)


def _store(url: str | None):
    """A `RunStore` on a client that fails fast (never stalls the loop), or None when Redis at
    `url` does not answer (`ddpviz run`, `ddpviz upload`, `ddpviz tune`)."""
    from ddpviz.workers.connection import connect
    from ddpviz.workers.store import RunStore

    try:
        return RunStore(connect(url, retry_attempts=0, socket_timeout_s=2.0))
    except Exception:
        return None


def upload_hint(spool: Path, url: str | None) -> str:
    """The `ddpviz upload` command that sends `spool` to the run's own Redis (`url`, its password
    shown as ``***``: `ddpviz upload` without --url also finds it in the spool when it has none)."""
    from ddpviz.workers.connection import redact

    return f"ddpviz upload --url {redact(url)} {spool}" if url else f"ddpviz upload {spool}"


def cmd_upload(args: argparse.Namespace) -> int:
    """Send a spool's events that are not yet stored, and record the run's ending. Redis: --url,
    else $REDIS_URL, else the first that answers of the run's own (the spool's meta.json, when it had no
    password) and the default (`workers.connection.redis_url`: this user's running `ddpviz up`'s, ...);
    when none answers, the error names each one tried."""
    from ddpviz.workers.connection import redact, redis_url
    from ddpviz.workers.spool import read_json

    spool = Path(args.spool)
    meta = read_json(spool / "meta.json")
    if not meta or "run_id" not in meta:
        _say(f"refused: {spool} is not a ddpviz spool folder (no meta.json with a run_id)")
        return EXIT_REFUSED
    given = args.url or os.environ.get("REDIS_URL", "").strip()
    urls = [given] if given else list(dict.fromkeys(u for u in (meta.get("redis_url"), redis_url()) if u))
    store, url = None, urls[0]
    for i, url in enumerate(urls):
        if i:
            _say(f"the run's own Redis, {redact(urls[i - 1])}, did not answer; trying {redact(url)}")
        store = _store(url)
        if store is not None:
            break
    if store is None:
        from ddpviz.workers.connection import connect

        connect(url)  # raises RedisUnavailable, which names the URL
    run_id = meta["run_id"]
    try:
        store_spool(store, spool, run_id, meta.get("command"), meta.get("label"), ran_at=meta.get("created_at"),
                    ending=read_json(spool / "ending.json"), joined=bool(meta.get("joined")))
    except (redis.RedisError, OSError) as exc:
        _say(f"could not store every event: {exc}")
        return EXIT_FAILED
    from ddpviz.workers.spool import remove_spool

    remove_spool(spool)  # every event is stored: nothing of the run stays on disk
    _say(f"run {run_id}: sent to {redact(url)}; {spool} removed")
    print(run_id)
    return EXIT_OK
