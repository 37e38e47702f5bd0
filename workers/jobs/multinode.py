"""Multi-host DDP through the queue: a run with ``nnodes > 1`` becomes one node job per host.

`submit_multinode` picks ``nnodes`` live workers from their heartbeats (idle ones, on distinct
hosts first), stores one run record (with the planned ``hosts``) and enqueues node job i on worker
i's own queue ``ddpviz:node:{worker}`` (`workers.keys.node_queue`), all in one transaction. The
node jobs (`workers.jobs.node.execute_node`) meet at torch.distributed's c10d rendezvous, served
by node 0 at its worker's advertised address, and write into the run's one event stream;
`workers.jobs.nodes` merges their endings into the run's.

RQ job ids are ``{run_id}-n{i}``; the run id names the record, the stream and the cancel flag.
"""

from __future__ import annotations

import json
from typing import Any

import redis
from rq import Queue
from rq.serializers import JSONSerializer

from ddpviz.engine.config import ConfigError
from ddpviz.workers import keys
from ddpviz.workers.heartbeat import read_workers
from ddpviz.workers.jobs.run import JOB_TIMEOUT_S, NODE_JOB_FUNC, STOPPED_CALLBACK
from ddpviz.workers.keys import node_job_id, parse_node_job_id, rq_job_ids  # noqa: F401  (defined with the keys)
from ddpviz.workers.store import RunStore, new_run_id

RESULT_TTL_S = 24 * 3600
FAILURE_TTL_S = 7 * 24 * 3600


class NotEnoughWorkers(ConfigError):
    """Fewer idle live workers than ``nnodes``; the message names them (field ``nnodes``)."""


def _idle(worker: dict[str, Any]) -> bool:
    """No run, and RQ's state says it is (about to be) waiting for jobs."""
    return not worker.get("current_run") and worker.get("state") in (None, "", "idle", "starting")


def pick_workers(live: list[dict[str, Any]], nnodes: int) -> list[dict[str, Any]]:
    """`nnodes` distinct idle workers, preferring workers on hosts not yet picked (so two ranks'
    groups do not share one machine's GPUs when a cluster has more workers than hosts).

    Args:
        live: heartbeats from `workers.heartbeat.read_workers`.

    Raises:
        NotEnoughWorkers: fewer than `nnodes` idle workers; the message lists who is alive.
    """
    idle = [w for w in sorted(live, key=lambda w: w["name"]) if _idle(w)]
    picked: list[dict[str, Any]] = []
    hosts: set[str | None] = set()
    for w in idle:  # distinct hosts first ...
        if w.get("host") not in hosts:
            picked.append(w)
            hosts.add(w.get("host"))
    picked += [w for w in idle if w not in picked]  # ... then more workers on the same hosts
    if len(picked) < nnodes:
        busy = [f"{w['name']} (busy with {w.get('current_run') or w.get('state')})"
                for w in live if not _idle(w)]
        names = [w["name"] for w in idle]
        message = (f"nnodes={nnodes} needs {nnodes} idle workers, one per host; {len(idle)} idle "
                   f"({', '.join(names) or 'none'})" + (f", busy: {', '.join(busy)}" if busy else "")
                   + ". Start a worker on each host (REDIS_URL=... ddpviz worker --advertise-addr "
                     "ADDR) or wait for the busy ones")
        raise NotEnoughWorkers([("nnodes", message)])
    return picked[:nnodes]


def submit_multinode(connection: redis.Redis, config: dict[str, Any], *, label: str | None = None,
                     group: str | None = None) -> str:
    """Store a multi-host run and enqueue one node job per picked worker. Returns the run id.

    Args:
        config: a validated RunConfig as JSON (``nnodes > 1``, mode ddp).

    Raises:
        NotEnoughWorkers: fewer idle live workers than ``config["nnodes"]``.
    """
    nnodes = int(config["nnodes"])
    workers = pick_workers(read_workers(connection), nnodes)
    run_id = new_run_id()
    per_node = int(config["world_size"]) // nnodes
    hosts = [{"node": i, "worker": w["name"], "job_id": node_job_id(run_id, i), "nproc": per_node}
             for i, w in enumerate(workers)]
    store = RunStore(connection)
    with connection.pipeline(transaction=True) as pipe:  # record and node jobs appear together
        pipe.multi()
        store.create(run_id, config, label=label, group=group, pipeline=pipe)
        # `worker` names node 0's worker, a real one (workers.liveness judges a run by its
        # heartbeat); every host is in `hosts`.
        pipe.hset(keys.run(run_id), mapping={"hosts": json.dumps(hosts), "worker": hosts[0]["worker"]})
        for h in hosts:
            Queue(keys.node_queue(h["worker"]), connection=connection, serializer=JSONSerializer).enqueue(
                NODE_JOB_FUNC, args=[run_id, h["node"]], job_id=h["job_id"], job_timeout=JOB_TIMEOUT_S,
                result_ttl=RESULT_TTL_S, failure_ttl=FAILURE_TTL_S, on_stopped=STOPPED_CALLBACK,
                description=f"ddpviz run {run_id} node {h['node']}/{nnodes} on {h['worker']}",
                pipeline=pipe)
        pipe.execute()
    return run_id
