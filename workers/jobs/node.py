"""The RQ job that runs one host's part of a multi-host DDP run (`workers.jobs.multinode`).

Node 0 serves the c10d rendezvous store: it picks a port (``$DDPVIZ_RDZV_PORTS``, e.g.
``29400-29409``, else any free port) and publishes ``{advertise_addr}:{port}`` in the run's nodes
hash; the other nodes wait for it (at most `ENDPOINT_WAIT_S`) and join. Then every node runs
`engine.run.run_training` with its `NodeSpec` — ``world_size // nnodes`` rank processes under
torch elastic — and forwards its ranks' events, labelled ``host = worker name``, into the run's
one stream. The engine's per-node ``run_started`` / ``run_finished`` are held back: node 0 emits
one ``run_started`` with every host's devices, and the last node to end emits the one
``run_finished`` (`workers.jobs.nodes.settle`).

A failure on one host ends the run on all: the engine's collectives fail on the other hosts
("connection closed by peer"), and a node whose ranks are still running `PEER_ABORT_GRACE_S`
seconds after another node failed stops them (they may be stuck in a collective that only times
out after ``collective_timeout_s``). The run's error is the root cause, not those echoes.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import redis

from ddpviz.engine.config import ConfigError, validate_config
from ddpviz.workers.host.reaper import RUN_ENV_VAR
from ddpviz.workers.jobs.multinode import node_job_id
from ddpviz.workers.jobs.nodes import POLL_S, NodeState, settle_when_all_report, update_record_hosts
from ddpviz.workers.jobs.run import CancelPoller, default_worker_name, stop_fork_server
from ddpviz.workers.sink import DEFAULT_STREAM_MAXLEN, run_sink
from ddpviz.workers.store import TERMINAL, RunStatus, RunStore, make_error

ADVERTISE_ENV = "DDPVIZ_ADVERTISE_ADDR"  # set by `ddpviz worker --advertise-addr`
RDZV_PORTS_ENV = "DDPVIZ_RDZV_PORTS"  # "LOW-HIGH": node 0 serves the rendezvous on a port in it
DEFAULT_ADVERTISE_ADDR = "127.0.0.1"
ENDPOINT_WAIT_S = 120.0  # a node waits this long for node 0 to publish the rendezvous endpoint
PLAN_WAIT_S = 60.0  # node 0 waits this long for the other hosts' device plans (run_started)
PEER_ABORT_GRACE_S = 10.0  # after another host failed, this host's ranks get this long to end
PEER_POLL_S = 0.5
RESULT_WAIT_S = 90.0  # after its own end, a node waits this long for the others' before settling


def advertise_addr() -> str:
    """The address other hosts reach this worker at: ``$DDPVIZ_ADVERTISE_ADDR`` or 127.0.0.1."""
    return os.environ.get(ADVERTISE_ENV, "").strip() or DEFAULT_ADVERTISE_ADDR


def rdzv_port(ports: str | None = None) -> int:
    """A TCP port free on every interface now: the first free one in ``LOW-HIGH`` (`ports`,
    default ``$DDPVIZ_RDZV_PORTS``), else one the OS picks from its ephemeral range.

    Raises:
        RuntimeError: every port in the range is taken, or the range is malformed.
    """
    spec = (ports if ports is not None else os.environ.get(RDZV_PORTS_ENV, "")).strip()
    candidates = [0]
    if spec:
        try:
            low, high = (int(p) for p in spec.split("-", 1)) if "-" in spec else (int(spec),) * 2
        except ValueError:
            raise RuntimeError(f"{RDZV_PORTS_ENV} must be PORT or LOW-HIGH (got {spec!r})") from None
        candidates = list(range(low, high + 1))
    for port in candidates:
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError(f"no free port in {RDZV_PORTS_ENV}={spec} for the rendezvous")


class PeerAbort:
    """``should_stop`` for a node: the run's cancel flag (`poller`), this node job's own (set by
    its worker's warm shutdown, `job_poller`), or another host failed more than `grace_s` seconds
    ago (Redis is asked at most every `PEER_POLL_S`)."""

    def __init__(self, state: NodeState, poller: CancelPoller, job_poller: CancelPoller | None = None,
                 grace_s: float = PEER_ABORT_GRACE_S):
        self.state, self.poller, self.job_poller, self.grace_s = state, poller, job_poller, grace_s
        self.peer_failed = False
        self._next = 0.0

    @property
    def reason(self) -> str | None:
        """Why this node was asked to stop (a cancel request), or None."""
        return self.poller.reason or (self.job_poller.reason if self.job_poller else None)

    def __call__(self) -> bool:
        if self.poller() or (self.job_poller is not None and self.job_poller()) or self.peer_failed:
            return True
        if time.monotonic() < self._next:
            return False
        self._next = time.monotonic() + PEER_POLL_S
        try:
            since = self.state.failed_since()
        except redis.RedisError:
            return False
        self.peer_failed = since is not None and time.time() - since >= self.grace_s
        return self.peer_failed


class NodeSink:
    """This node's event sink: rank events go to the run's stream (batched) with ``host`` set;
    the engine's ``run_started`` becomes this node's plan (node 0 merges every plan into the one
    ``run_started``); its ``run_finished`` is dropped (`run_node` records the node's end)."""

    def __init__(self, connection: redis.Redis, run_id: str, index: int, hosts: list[dict],
                 worker: str, stop: PeerAbort, maxlen: int = DEFAULT_STREAM_MAXLEN):
        self.redis, self.run_id, self.index, self.hosts, self.worker = connection, run_id, index, hosts, worker
        self.state, self.stop = NodeState(connection, run_id), stop
        self.batched, self.writer = run_sink(connection, run_id, maxlen)
        self.ranks: set[int] = set()

    def emit(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "run_finished":
            return
        if kind == "run_started":
            self._started(event)
            return
        event.setdefault("host", self.worker)
        rank = event.get("rank")
        if rank is not None and rank not in self.ranks:  # a rank of this host spoke: record it
            self.ranks.add(rank)
            try:
                self.state.publish_ranks(self.index, sorted(self.ranks))
                update_record_hosts(self.redis, self.run_id)
            except redis.RedisError:
                pass  # the record misses a rank until the run ends; training goes on
        self.batched.emit(event)

    def _started(self, event: dict[str, Any]) -> None:
        keys_ = ("hostname", "backend", "devices", "device_names", "emulated", "torch_version")
        self.state.publish_plan(self.index, {k: event.get(k) for k in keys_})
        if self.index != 0:
            return
        plans = self._wait_for_plans()
        backends = {p.get("backend") for p in plans.values()}
        if len(backends) > 1:
            from ddpviz.engine.components.devices import PreflightError

            found = ", ".join(f"{self.hosts[i]['worker']}: {p.get('backend')} on {p.get('device_names')}"
                              for i, p in sorted(plans.items()))
            raise PreflightError("backend", f"the hosts resolved different backends ({found}); set "
                                 f"device and backend explicitly, or give every host world_size/nnodes GPUs")
        merged = merge_started(event, plans, self.hosts)
        self.writer.emit(merged)  # first in the stream, unbatched
        try:
            RunStore(self.redis).save_started(self.run_id, merged)  # outlives the stream's cap
            update_record_hosts(self.redis, self.run_id)
        except redis.RedisError:
            pass  # the record shows the plan at the end; the stream has it now

    def _wait_for_plans(self) -> dict[int, dict]:
        """The plans of every node; stops waiting after `PLAN_WAIT_S`, on cancel, or when a node
        ended without one."""
        deadline = time.monotonic() + PLAN_WAIT_S
        while True:
            plans, results = self.state.by_node("plan"), self.state.by_node("result")
            if all(h["node"] in plans or h["node"] in results for h in self.hosts) \
                    or time.monotonic() > deadline or self.stop():
                return plans
            time.sleep(POLL_S)

    def close(self) -> None:
        self.batched.close()


def merge_started(event: dict[str, Any], plans: dict[int, dict], hosts: list[dict]) -> dict[str, Any]:
    """Node 0's ``run_started`` with every host's devices: ``devices`` (each with ``host``) and
    ``device_names`` concatenated in node order, ``nnodes``, and ``hosts`` (one entry per node:
    ``worker``, ``hostname``, ``backend``, ``device_names``, ``nproc``)."""
    order = sorted(plans)
    workers = {h["node"]: h["worker"] for h in hosts}
    return {**event, "nnodes": len(hosts),
            "devices": [dict(d, host=workers[i]) for i in order for d in plans[i].get("devices") or []],
            "device_names": [n for i in order for n in plans[i].get("device_names") or []],
            "hosts": [{"node": h["node"], "worker": h["worker"], "nproc": h["nproc"],
                       "hostname": (plans.get(h["node"]) or {}).get("hostname"),
                       "backend": (plans.get(h["node"]) or {}).get("backend"),
                       "device_names": (plans.get(h["node"]) or {}).get("device_names")} for h in hosts]}


def execute_node(run_id: str, index: int) -> str:
    """RQ job: run node `index` of the multi-host run `run_id`. Returns the run's status after
    this node's end (``started`` while other nodes still run)."""
    from rq import get_current_job

    job = get_current_job()
    worker = (job.worker_name if job is not None else None) or default_worker_name()
    return run_node(job.connection, run_id, int(index), worker_name=worker)


def run_node(connection: redis.Redis, run_id: str, index: int, *, worker_name: str,
             workdir: str | Path | None = None, result_wait_s: float = RESULT_WAIT_S) -> str:
    """Run this host's ranks of `run_id`, record this node's end, and settle the run when all
    nodes have ended. Raises LookupError if there is no run record."""
    store = RunStore(connection)
    record = store.get(run_id)
    if record is None:
        raise LookupError(f"no run record {run_id!r}")
    if store.status(run_id) in TERMINAL:
        return store.status(run_id).value  # canceled (or failed by another node) before we began
    state = NodeState(connection, run_id)
    state.mark_started(index, worker_name, advertise_addr())
    try:
        cfg = validate_config(record["config"])
    except ConfigError as exc:
        status, error, summary = RunStatus.FAILED, make_error(f"ConfigError: {exc}"), None
    else:
        store.transition(run_id, RunStatus.STARTED, allowed_from=[RunStatus.QUEUED],
                         fields={"started_at": repr(time.time())})
        from ddpviz.workers.heartbeat import set_current_run

        set_current_run(connection, worker_name, run_id)
        status, error, summary = _run_part(store, state, cfg, run_id, index, record["hosts"],
                                           worker_name, workdir)
    if error is not None:
        error = {**error, "host": error.get("host") or worker_name}
    state.record_result(index, status, error, summary, worker_name)
    settle_when_all_report(connection, run_id, result_wait_s)
    return store.status(run_id).value


def _endpoint(state: NodeState, store: RunStore, run_id: str, index: int, hosts: list[dict],
              stop: PeerAbort) -> tuple[str | None, tuple | None]:
    """(endpoint, None), or (None, (status, error)) when this node must not join."""
    if index == 0:
        try:
            endpoint = f"{advertise_addr()}:{rdzv_port()}"
        except RuntimeError as exc:
            return None, (RunStatus.FAILED, make_error(f"RendezvousPortError: {exc}"))
        state.publish_endpoint(endpoint)
        return endpoint, None
    deadline = time.monotonic() + ENDPOINT_WAIT_S
    while True:
        endpoint = state.endpoint()
        if endpoint:
            return endpoint, None
        if stop.poller() or (stop.job_poller is not None and stop.job_poller()):
            return None, (RunStatus.CANCELED, make_error(f"Canceled: {stop.reason}"))
        if store.status(run_id) in TERMINAL or state.failed_since() is not None:
            return None, (RunStatus.CANCELED, {**make_error(
                "Canceled: another host failed before the rendezvous"), "echo": True})
        if time.monotonic() > deadline:
            return None, (RunStatus.FAILED, make_error(
                f"RendezvousEndpointTimeout: node 0 (worker {hosts[0]['worker']}) did not publish the "
                f"rendezvous endpoint within {ENDPOINT_WAIT_S:g} s: is that worker busy or gone?"))
        time.sleep(POLL_S)


def _run_part(store: RunStore, state: NodeState, cfg: Any, run_id: str, index: int,
              hosts: list[dict], worker: str, workdir: str | Path | None):
    """Train this node's ranks. Returns (status, error, summary)."""
    from ddpviz.engine.modes.launcher import NodeSpec
    from ddpviz.engine.run import run_training  # imports torch: only in the work-horse

    stop = PeerAbort(state, CancelPoller(store, run_id), CancelPoller(store, node_job_id(run_id, index)))
    endpoint, ended = _endpoint(state, store, run_id, index, hosts, stop)
    if ended is not None:
        return (*ended, None)
    node = NodeSpec(nnodes=cfg.nnodes, rdzv_endpoint=endpoint, is_host=index == 0,
                    host_label=worker, local_addr=advertise_addr())
    sink = NodeSink(store.redis, run_id, index, hosts, worker, stop, store.stream_maxlen)
    previous = os.environ.get(RUN_ENV_VAR)
    os.environ[RUN_ENV_VAR] = node_job_id(run_id, index)  # the worker's hooks reap by job id
    tmp = tempfile.TemporaryDirectory(prefix=f"ddpviz-{run_id}-n{index}-") if workdir is None else None
    wd = Path(tmp.name if tmp is not None else workdir)
    try:
        result = run_training(cfg, sink, run_id, should_stop=stop, workdir=wd, node=node)
        status, error, summary = RunStatus(result.status), result.error, result.summary
        if status is RunStatus.CANCELED:
            status, error = _why_canceled(stop, error, wd)
    except Exception as exc:  # an engine bug or RQ's job timeout: still end this node
        status, summary = RunStatus.FAILED, None
        error = make_error(f"{type(exc).__name__}: {exc}", traceback.format_exc())
    finally:
        if previous is None:
            os.environ.pop(RUN_ENV_VAR, None)
        else:
            os.environ[RUN_ENV_VAR] = previous
        try:
            sink.close()
        except Exception:
            pass  # the stream's tail is lost; the record still gets the end
        if tmp is not None:
            tmp.cleanup()
        stop_fork_server()  # as a single-host run's end does (workers.jobs.run)
    return status, error, summary


def _why_canceled(stop: PeerAbort, error: dict | None, workdir: Path) -> tuple[RunStatus, dict]:
    """A canceled node: by the user (cancel flag), or stopped because another host failed — then
    a rank of this host that raised meanwhile is reported as this node's failure."""
    if stop.reason is not None:
        said = (error or {}).get("exception")
        return RunStatus.CANCELED, make_error(f"Canceled: {stop.reason}" + (f" ({said})" if said else ""))
    raised = sorted(workdir.glob("local*.error.json"), key=lambda p: p.stat().st_mtime)
    if raised:
        err = json.loads(raised[0].read_text())
        return RunStatus.FAILED, {k: err.get(k) for k in ("rank", "host", "step", "exception", "traceback")}
    return RunStatus.CANCELED, {**make_error("Canceled: another host failed, so this host's ranks "
                                             "were stopped"), "echo": True}
