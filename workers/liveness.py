"""Runs whose worker died: finding them and marking them `lost`.

A worker refreshes its heartbeat hash every `HEARTBEAT_INTERVAL_S` seconds and the hash expires
`HEARTBEAT_TTL_S` seconds after the last refresh (`workers.heartbeat`). A run in status started
whose worker's heartbeat has expired lost its worker: killed (SIGKILL, OOM killer), or its host
went down. Its processes died with it (the work-horse and the rank processes carry a parent-death
signal), so nothing will ever record how it ended. Two paths mark such runs `lost`:

- every live worker's heartbeat thread calls `LostRunMonitor.sweep` every `MONITOR_INTERVAL_S`
  seconds; a run is marked lost once its worker's heartbeat has been missing on two sweeps at least
  `HEARTBEAT_INTERVAL_S` apart, so a Redis restart that drops heartbeats for a moment costs no run;
- the client checks each started run it reads (`check_records`), so a lone dead worker's run is
  still seen as lost when no other worker runs.

Worst case from SIGKILL to lost: the monitor ~``HEARTBEAT_TTL_S + 2 * MONITOR_INTERVAL_S`` (25 s),
the client ``HEARTBEAT_TTL_S`` (15 s) after the last heartbeat. A worker that finds its own run
marked lost (it was only unreachable) sets it back to started (`RunStore.revive`).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from ddpviz.workers import keys
from ddpviz.workers.heartbeat import HEARTBEAT_INTERVAL_S, HEARTBEAT_TTL_S
from ddpviz.workers.store import RunStatus, RunStore, make_error

log = logging.getLogger("ddpviz.worker")

MONITOR_INTERVAL_S = 5.0  # between sweeps of one worker's monitor
LOST_GRACE_S = float(HEARTBEAT_TTL_S)  # a run younger than this is never judged lost


def lost_error(run_id: str, worker: str) -> dict:
    """The error recorded on a lost run: what happened and what to do."""
    if worker.startswith(keys.ATTACH_LAUNCHER):
        return make_error(
            f"LauncherLost: `ddpviz run` ({worker[len(keys.ATTACH_LAUNCHER):]}, host:pid) stopped sending "
            f"heartbeats (none for {HEARTBEAT_TTL_S} s): it was killed or its host went down. Its command "
            f"got SIGTERM when it died (parent-death signal); the events it wrote after that are in "
            f"the run's spool folder: `ddpviz upload SPOOL` sends them")
    return make_error(
        f"WorkerLost: worker {worker!r} stopped sending heartbeats (none for {HEARTBEAT_TTL_S} s) "
        f"while running this run; it was killed or its host went down, and the run's processes "
        f"died with it. Re-queue it: `ddpviz requeue {run_id}`")


def heartbeats_alive(redis: Any, names: set[str]) -> dict[str, bool]:
    """{worker name: its heartbeat hash exists} for `names` (one round trip)."""
    names = sorted(n for n in names if n)
    if not names:
        return {}
    pipe = redis.pipeline(transaction=False)
    for name in names:
        pipe.exists(keys.worker(name))
    return {name: bool(n) for name, n in zip(names, pipe.execute())}


def _is_orphan(rec: dict[str, Any], alive: dict[str, bool], now: float) -> bool:
    return (rec.get("status") == RunStatus.STARTED.value and bool(rec.get("worker"))
            and not alive.get(rec["worker"], False)
            and (rec.get("started_at") or now) + LOST_GRACE_S <= now)


def check_records(store: RunStore, records: list[dict[str, Any]],
                  now: float | None = None) -> list[dict[str, Any]]:
    """`records` with every started run whose worker's heartbeat is gone marked lost (and its
    record re-read). Records of other statuses pass through untouched."""
    started = [r for r in records if r and r.get("status") == RunStatus.STARTED.value]
    if not started:
        return records
    now = time.time() if now is None else now
    alive = heartbeats_alive(store.redis, {r.get("worker") or "" for r in started})
    changed = {}
    for rec in started:
        if _is_orphan(rec, alive, now):
            if store.mark_lost(rec["run_id"], lost_error(rec["run_id"], rec["worker"])):
                log.warning("run %s: lost (worker %s stopped sending heartbeats)", rec["run_id"],
                            rec["worker"])
            changed[rec["run_id"]] = store.get(rec["run_id"])
    return [changed.get(r["run_id"], r) if r else r for r in records]


class LostRunMonitor:
    """Marks runs lost whose worker stopped sending heartbeats; run by each live worker.

    Args:
        store: a RunStore on the heartbeat thread's own connection.
        name: this worker's name (its own runs are never judged).
        current: returns the id of the run this worker is running now, or None (``"dp,ddp"``
            while it runs a pair in turns, `workers.jobs.pair`: both are its own).
        confirm_s: a run's worker must stay missing this long (two sweeps) before it is lost.
    """

    def __init__(self, store: RunStore, name: str, current: Callable[[], str | None],
                 interval_s: float = MONITOR_INTERVAL_S, confirm_s: float = HEARTBEAT_INTERVAL_S):
        self.store, self.name, self.current = store, name, current
        self.interval_s, self.confirm_s = interval_s, confirm_s
        self.suspects: dict[str, float] = {}  # run id -> when its worker was first seen missing
        self._next_sweep = 0.0

    def maybe_sweep(self) -> list[str]:
        """`sweep()` if `interval_s` has passed since the last one, else nothing."""
        if time.monotonic() < self._next_sweep:
            return []
        self._next_sweep = time.monotonic() + self.interval_s
        return self.sweep()

    def sweep(self, now: float | None = None) -> list[str]:
        """One pass over the started runs. Returns the ids marked lost now."""
        now = time.time() if now is None else now
        self._revive_own()
        run_ids = self.store.started_runs()
        pipe = self.store.redis.pipeline(transaction=False)
        for rid in run_ids:
            pipe.hmget(keys.run(rid), "status", "worker", "started_at")
        rows = {rid: [v.decode() if v else None for v in row]
                for rid, row in zip(run_ids, pipe.execute() if run_ids else [])}
        stale = [rid for rid, (status, _, _) in rows.items() if status != RunStatus.STARTED.value]
        if stale:  # ended or deleted records left in the index
            self.store.redis.srem(keys.STARTED, *stale)
        runs = {rid: {"run_id": rid, "status": s, "worker": w, "started_at": float(t) if t else None}
                for rid, (s, w, t) in rows.items() if rid not in stale and w != self.name}
        alive = heartbeats_alive(self.store.redis, {r["worker"] or "" for r in runs.values()})
        lost = []
        for rid, rec in runs.items():
            if not _is_orphan(rec, alive, now):
                self.suspects.pop(rid, None)
                continue
            first = self.suspects.setdefault(rid, now)
            if now - first >= self.confirm_s:
                self.suspects.pop(rid, None)
                if self.store.mark_lost(rid, lost_error(rid, rec["worker"])):
                    log.warning("run %s: lost (worker %s stopped sending heartbeats)", rid, rec["worker"])
                    lost.append(rid)
        for rid in set(self.suspects) - set(runs):
            del self.suspects[rid]
        return lost

    def _revive_own(self) -> None:
        for run_id in (self.current() or "").split(","):  # "dp,ddp" while a pair job runs both
            if run_id and self.store.status(run_id) is RunStatus.LOST:
                if self.store.revive(run_id, self.name):
                    log.warning("run %s: was marked lost while this worker was unreachable; it goes on",
                                run_id)
