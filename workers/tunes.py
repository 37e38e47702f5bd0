"""Stored `ddpviz tune` searches. Imports no torch: the app's Tune page reads them.

A search run with Redis answering keeps each trial as an ordinary attached run (its spool stored
by `workers.attached.store_spool`, labelled `trial_run_label`) and its report (`ddpviz tune
--json`'s object, every trial's `runs` rows naming their `run_id`, plus `tune_id` and
`stored_at`) under ``ddpviz:tune:{tune_id}``, indexed by ``ddpviz:tunes`` (`workers.keys`).
Without Redis, tune keeps nothing and says so once (`TuneKeeper`): the search itself never
depends on Redis.

Example:
    >>> [t["tune_id"] for t in list_tunes(client.redis)]  # newest first
    ['3f9c0a1b2d', '77aa01c3e4']
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from ddpviz.workers import keys

MAX_LISTED = 50  # stored tunes the Tune page offers, newest first


def label(knobs: dict[str, Any]) -> str:
    """"bucket_cap_mb=4.0, static_graph=True", or the baseline's name for no knobs."""
    return ", ".join(f"{k}={v}" for k, v in knobs.items()) or "baseline (the script's own settings)"


def note_check(note: str | None) -> str:
    """A trial note's verdict on the math, its words before the first colon ("same math: losses within ..." ->
    "same math"): the terminal's and the Tune page's `check` column."""
    return (note or "").split(":")[0]


def trial_run_label(tune_id: str, knobs: dict[str, Any], round_: int | None) -> str:
    """A trial's run label: ``"tune 3f9c0a1b2d · bucket_cap_mb=4.0 · round 2"``; the baseline is
    ``baseline``, and the first baseline trial (before the rounds: the one candidates and
    predictions come from) ``reference``."""
    what = ", ".join(f"{k}={v}" for k, v in knobs.items()) or "baseline"
    return f"tune {tune_id} · {what} · " + ("reference" if round_ is None else f"round {round_ + 1}")


def save_tune(r: Any, report: dict[str, Any]) -> None:
    """Store `report` (it carries its `tune_id`) and index it by now, in one transaction."""
    now = time.time()
    pipe = r.pipeline(transaction=True)
    pipe.set(keys.tune(report["tune_id"]), json.dumps({**report, "stored_at": now}, default=str))
    pipe.zadd(keys.TUNES, {report["tune_id"]: now})
    pipe.execute()


def get_tune(r: Any, tune_id: str) -> dict[str, Any] | None:
    """The stored report of `tune_id`, or None."""
    raw = r.get(keys.tune(tune_id))
    return json.loads(raw) if raw else None


def list_tunes(r: Any, limit: int = MAX_LISTED) -> list[dict[str, Any]]:
    """The newest `limit` stored reports, newest first."""
    ids = [i.decode() if isinstance(i, bytes) else i for i in r.zrevrange(keys.TUNES, 0, limit - 1)]
    return [json.loads(raw) for raw in (r.mget([keys.tune(i) for i in ids]) if ids else []) if raw]


class TuneKeeper:
    """Where one `ddpviz tune` keeps its trials and its report: a `RunStore`, or None when Redis
    did not answer. A Redis lost mid-search is said once (`say`); the search goes on and keeps
    nothing more.

    Args:
        store: a `workers.store.RunStore` on a client that fails fast, or None.
        cmd: the tuned command (each trial run's record names it).
        say: one line on stderr.
    """

    def __init__(self, store: Any, cmd: list[str], say: Callable[[str], None]):
        self.store, self.cmd, self.say = store, cmd, say
        self.tune_id = uuid.uuid4().hex[:10]

    def _lost(self, exc: BaseException) -> None:
        self.store = None
        self.say(f"Redis stopped answering ({exc}): from here on nothing of this search is stored")

    def new_run(self) -> str | None:
        """A run id for the next trial (its events carry it), or None when nothing is stored."""
        from ddpviz.workers.store import new_run_id

        return new_run_id() if self.store is not None else None

    def keep_trial(self, spool: Path, trial: dict[str, Any], run_id: str, run_label: str) -> str | None:
        """Store a trial's spool as run `run_id`, ended as the trial ended (`succeeded`, or
        `failed` with its error); returns `run_id`, or None when it was not stored."""
        import redis

        from ddpviz.workers.attached import store_spool

        if self.store is None:
            return None
        ending = dict(status="succeeded" if trial["error"] is None else "failed", error=trial["error"],
                      exit_code=trial["exit_code"], ended_at=trial["started_at"] + trial["wall_s"])
        try:
            store_spool(self.store, spool, run_id, self.cmd, run_label, ran_at=trial["started_at"], ending=ending)
        except (redis.RedisError, OSError) as exc:
            self._lost(exc)
            return None
        return run_id

    def keep_report(self, report: dict[str, Any]) -> str | None:
        """Store the report under this search's `tune_id` (set in `report` when stored); returns
        the id, or None."""
        import redis

        if self.store is None:
            return None
        try:
            save_tune(self.store.redis, {**report, "tune_id": self.tune_id})
        except (redis.RedisError, OSError) as exc:
            self._lost(exc)
            return None
        report["tune_id"] = self.tune_id
        return self.tune_id
