"""The shared state of a multi-host run's node jobs, and how their endings become one run ending.

A multi-host run (``nnodes > 1``) has one run record and one event stream, but ``nnodes`` node
jobs, each on its own worker (`workers.jobs.multinode`). They coordinate through one hash,
``ddpviz:nodes:{run_id}``:

| field | written by | holds |
|---|---|---|
| ``endpoint`` | node 0 | ``addr:port`` of the c10d rendezvous store (node 0 serves it) |
| ``started:{i}`` | node i | JSON ``{worker, advertise_addr, ts}`` when its job began |
| ``plan:{i}`` | node i | JSON: the devices node i resolved (its engine's ``run_started``) |
| ``ranks:{i}`` | node i | JSON list of the global ranks that run on node i (known after rendezvous) |
| ``result:{i}`` | node i, or a worker hook when its job died | JSON ``{status, error, summary, worker, ts}`` |

Every node records its result, then `settle` tries to end the run: once every node has a result
(or the missing ones' workers are gone), the statuses and errors are merged (`merge_endings`) —
a failure fails the run and its error is the root cause, not the "connection closed by peer"
echoes it caused on the other hosts — and `RunStore.finish` (a compare-and-set) records it and appends the only
``run_finished`` event, with a summary built from the whole stream.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import redis

from ddpviz.workers import keys
from ddpviz.workers.heartbeat import read_workers
from ddpviz.workers.sink import decode_entries
from ddpviz.workers.store import ACTIVE, TERMINAL, RunStatus, RunStore, make_error

NODES_TTL_S = 7 * 24 * 3600  # the coordination hash outlives any run, then goes
POLL_S = 0.2

# Errors that a failure on another host causes here: the peer's sockets closed, a collective or
# the rendezvous timed out waiting for it, or this node was stopped because another one failed.
# Matched case-insensitively against the error's exception text.
ECHO_PATTERNS = (
    r"closed by peer", r"reset by peer", r"connection refused", r"broken pipe",
    r"remote worker (crash|hang)", r"remote process exited", r"network error",
    r"ncclremoteerror", r"communicator was aborted", r"timed out", r"timeout",
    r"rendezvous", r"another host failed", r"peer(s)? (gone|failed)",
)
_ECHO = re.compile("|".join(ECHO_PATTERNS), re.IGNORECASE)


def is_echo(error: dict | None) -> bool:
    """True if `error` reads like a consequence of another host's failure (see `ECHO_PATTERNS`)."""
    return bool(error) and (bool(error.get("echo")) or bool(_ECHO.search(error.get("exception") or "")))


class NodeState:
    """Reads and writes ``ddpviz:nodes:{run_id}`` (see module docstring)."""

    def __init__(self, connection: redis.Redis, run_id: str):
        self.redis, self.run_id, self.key = connection, run_id, keys.nodes(run_id)

    def _set(self, field: str, value: Any, *, only_new: bool = False) -> bool:
        pipe = self.redis.pipeline(transaction=True)
        (pipe.hsetnx if only_new else pipe.hset)(self.key, field, json.dumps(value, default=str))
        pipe.expire(self.key, NODES_TTL_S)
        return bool(pipe.execute()[0]) or not only_new

    def _get_all(self) -> dict[str, Any]:
        return {k.decode(): json.loads(v) for k, v in self.redis.hgetall(self.key).items()}

    def mark_started(self, index: int, worker: str, advertise_addr: str | None) -> None:
        self._set(f"started:{index}", {"worker": worker, "advertise_addr": advertise_addr,
                                        "ts": time.time()})

    def publish_endpoint(self, endpoint: str) -> None:
        self._set("endpoint", endpoint)

    def endpoint(self) -> str | None:
        raw = self.redis.hget(self.key, "endpoint")
        return json.loads(raw) if raw else None

    def publish_plan(self, index: int, plan: dict[str, Any]) -> None:
        self._set(f"plan:{index}", plan)

    def publish_ranks(self, index: int, ranks: list[int]) -> None:
        self._set(f"ranks:{index}", sorted(ranks))

    def record_result(self, index: int, status: RunStatus, error: dict | None,
                      summary: dict | None, worker: str | None) -> bool:
        """Store node `index`'s ending unless one is stored already. True if this call stored it."""
        return self._set(f"result:{index}", {"status": RunStatus(status).value, "error": error,
                                             "summary": summary, "worker": worker, "ts": time.time()},
                         only_new=True)

    def by_node(self, prefix: str) -> dict[int, Any]:
        """``{node index: value}`` of the fields ``{prefix}:{i}``."""
        return {int(k.split(":", 1)[1]): v for k, v in self._get_all().items()
                if k.startswith(prefix + ":")}

    def failed_since(self) -> float | None:
        """Unix time of the earliest failed node result, or None if no node has failed."""
        times = [r["ts"] for r in self.by_node("result").values() if r["status"] == RunStatus.FAILED.value]
        return min(times) if times else None


def host_plan(hosts: list[dict[str, Any]], state: dict[str, Any]) -> list[dict[str, Any]]:
    """The record's ``hosts`` list: the workers picked at submit, completed with what each node
    reported (devices, backend, ranks, address). `state` is `NodeState._get_all()`."""
    out = []
    for h in hosts:
        i = h["node"]
        plan, started = state.get(f"plan:{i}") or {}, state.get(f"started:{i}") or {}
        out.append({**h, "hostname": plan.get("hostname"), "advertise_addr": started.get("advertise_addr"),
                    "backend": plan.get("backend"), "device_names": plan.get("device_names"),
                    "devices": plan.get("devices"), "ranks": state.get(f"ranks:{i}")})
    return out


def update_record_hosts(connection: redis.Redis, run_id: str) -> list[dict[str, Any]] | None:
    """Rewrite the record's ``hosts`` field from the nodes hash (WATCHed, so concurrent nodes
    never write a stale view). Returns the new list, or None when the run has no hosts."""
    store = RunStore(connection)
    with connection.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(keys.nodes(run_id))
                record = store.get(run_id)
                if record is None or not record.get("hosts"):
                    pipe.unwatch()
                    return None
                state = {k.decode(): json.loads(v) for k, v in pipe.hgetall(keys.nodes(run_id)).items()}
                hosts = host_plan(record["hosts"], state)
                pipe.multi()
                pipe.hset(keys.run(run_id), "hosts", json.dumps(hosts, default=str))
                pipe.execute()
                return hosts
            except redis.WatchError:
                continue


def merge_endings(results: dict[int, dict[str, Any]]) -> tuple[RunStatus, dict | None]:
    """The run's status and error from its nodes' endings: the root cause decides.

    In order: the earliest failure that is not an echo of another host's failure (`is_echo`)
    fails the run; else the earliest cancel that is not an echo (the user, a worker shutting
    down) cancels it; else the earliest failure fails it; else it was canceled. Statuses other
    than finished/canceled (a lost host) count as failures. Every node finished: (finished, None).

    Returns:
        (status, error); error is ``{rank, host, exception, traceback, other_hosts: [{host, rank,
        exception}]}``.
    """
    ended = [(r["ts"], i, {**r, "error": r.get("error") or make_error(f"host ended {r['status']}")})
             for i, r in results.items() if r["status"] != RunStatus.SUCCEEDED.value]
    if not ended:
        return RunStatus.SUCCEEDED, None

    def failed(e: tuple) -> bool:
        return e[2]["status"] != RunStatus.CANCELED.value

    def real(e: tuple) -> bool:
        return not is_echo(e[2]["error"])

    rules = ((lambda e: failed(e) and real(e), RunStatus.FAILED),
             (lambda e: not failed(e) and real(e), RunStatus.CANCELED),
             (failed, RunStatus.FAILED), (lambda e: True, RunStatus.CANCELED))
    status, causes = next((st, [e for e in ended if rule(e)]) for rule, st in rules
                          if any(rule(e) for e in ended))
    _, index, chosen = min(causes, key=lambda e: (e[0], e[1]))
    error = {**chosen["error"], "host": chosen["error"].get("host") or chosen["worker"]}
    error.pop("echo", None)
    error["other_hosts"] = [{"host": r["error"].get("host") or r["worker"], "rank": r["error"].get("rank"),
                             "exception": r["error"].get("exception")}
                            for _, i, r in sorted(ended, key=lambda e: (e[0], e[1])) if i != index]
    quiet = sorted(r["worker"] for _, i, r in ended
                   if i != index and r["status"] == RunStatus.CANCELED.value and r["error"].get("echo"))
    if quiet and re.search(r"timed out|timeout", error.get("exception") or "", re.IGNORECASE):
        error["exception"] = error["exception"].rstrip() + (
            f" — the ranks on {', '.join(quiet)} raised no error and never joined that collective: "
            f"they stalled, and were stopped")
    return status, error


def stream_summary(connection: redis.Redis, run_id: str, node_summaries: list[dict | None]) -> dict:
    """The run's summary from every event in its stream (all hosts' ranks), as one host's engine
    would build it, with devices named ``{host}/{device}`` (every GPU host has a ``cuda:0``);
    ``wall_time_s`` is the longest node's."""
    from ddpviz.engine.summary import SummaryBuilder  # no torch

    builder, after = SummaryBuilder(), "0-0"
    while True:
        entries = connection.xrange(keys.events(run_id), min=f"({after}", max="+", count=5000)
        if not entries:
            break
        for event in decode_entries(entries):
            if event.get("host") and event.get("device"):
                event["device"] = f"{event['host']}/{event['device']}"
            builder.observe(event)
        after = entries[-1][0].decode()
    summary = builder.summary()
    walls = [s.get("wall_time_s") for s in node_summaries if s and s.get("wall_time_s") is not None]
    summary["wall_time_s"] = max(walls) if walls else None
    return summary


def settle(connection: redis.Redis, run_id: str, *, missing: dict[int, dict] | None = None) -> bool:
    """End the run if every node has a result (`missing` supplies errors for nodes that will
    never report). Returns True if the run is now terminal (by this call or an earlier one)."""
    store = RunStore(connection)
    if store.status(run_id) in TERMINAL:
        return True
    record = store.get(run_id)
    if record is None:
        return True
    nnodes = len(record.get("hosts") or []) or int(record["config"].get("nnodes", 1))
    results = NodeState(connection, run_id).by_node("result")
    for i, err in (missing or {}).items():
        results.setdefault(i, {"status": "failed", "error": err, "summary": None,
                               "worker": err.get("host"), "ts": time.time()})
    if len(results) < nnodes:
        return False
    update_record_hosts(connection, run_id)
    status, error = merge_endings(results)
    summary = stream_summary(connection, run_id, [r["summary"] for r in results.values()])
    store.finish(run_id, status, error=error, summary=summary, allowed_from=ACTIVE, append_event=True)
    return True


def settle_when_all_report(connection: redis.Redis, run_id: str, wait_s: float) -> None:
    """After recording this node's result: settle the run as soon as every node has reported, or
    as soon as every node still silent has lost its worker, or after `wait_s` seconds whatever."""
    deadline = time.monotonic() + wait_s
    while not settle(connection, run_id):
        silent = missing_nodes(connection, run_id)
        gone = {i: e for i, e in silent.items() if e["worker_gone"]}
        if len(gone) == len(silent) or time.monotonic() > deadline:
            settle(connection, run_id, missing={i: _missing_error(e, wait_s) for i, e in silent.items()})
            return
        time.sleep(POLL_S)


def missing_nodes(connection: redis.Redis, run_id: str) -> dict[int, dict]:
    """Nodes without a result: ``{index: {worker, worker_gone, started}}``."""
    record = RunStore(connection).get(run_id) or {}
    state = NodeState(connection, run_id)
    results, started = state.by_node("result"), state.by_node("started")
    live = {w["name"] for w in read_workers(connection)}
    return {h["node"]: {"worker": h["worker"], "worker_gone": h["worker"] not in live,
                        "started": h["node"] in started}
            for h in record.get("hosts") or [] if h["node"] not in results}


def _missing_error(info: dict, wait_s: float) -> dict:
    worker = info["worker"]
    if info["worker_gone"]:
        what = "stopped sending heartbeats (the worker or its host went down)"
    else:
        what = f"did not report within {wait_s:g} s of the other hosts"
    part = "its part of the run" if info["started"] else "its part of the run, which never started"
    return {**make_error(f"HostLost: worker {worker} {what}; {part} is lost"), "host": worker}


def settle_node_job(connection: redis.Redis, job_id: str, status: RunStatus, error: dict) -> bool:
    """For RQ's failure hooks (`workers.jobs.run`): if `job_id` is a node job, record how it ended
    (its work-horse was killed, it was stopped, its worker died) and try to settle the run.

    Returns:
        True if `job_id` is a node job (handled here), False for an ordinary run's job.
    """
    parsed = keys.parse_node_job_id(job_id)
    if parsed is None:
        return False
    run_id, index = parsed
    if status is not RunStatus.CANCELED:  # killed, abandoned, lost: this host failed
        status = RunStatus.FAILED
    hosts = (RunStore(connection).get(run_id) or {}).get("hosts") or []
    worker = next((h["worker"] for h in hosts if h["node"] == index), None)
    NodeState(connection, run_id).record_result(index, status, {**error, "host": worker}, None, worker)
    settle(connection, run_id)
    return True
