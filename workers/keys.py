"""Every Redis key ddpviz uses, in one place.

All keys live under the prefix ``ddpviz:`` so one Redis server (or one database) can be shared
with other applications and cleaned up by pattern. RQ's own keys (queues, jobs, registries,
worker records, the pub/sub command channel) go under ``ddpviz:rq:`` through RQ's
``RQ_KEY_PREFIX`` setting, which `workers/__init__.py` applies before RQ is imported.

Layout:

| key | type | holds |
|---|---|---|
| ``ddpviz:run:{run_id}`` | hash | one run record (see `workers.store`) |
| ``ddpviz:runs`` | sorted set | run ids scored by created time (unix seconds) |
| ``ddpviz:events:{run_id}`` | stream | the run's events, one field ``e`` holding the JSON |
| ``ddpviz:cancel:{run_id}`` | string | present while a cancel is requested; value = reason |
| ``ddpviz:worker:{name}`` | hash | a worker's heartbeat (expires unless refreshed) |
| ``ddpviz:workers`` | set | names of workers that have sent a heartbeat |
| ``ddpviz:nodes:{run_id}`` | hash | per-node state of a multi-host run (see `workers.jobs.nodes`) |
| ``ddpviz:retention`` | hash | the retention policy workers apply (see `workers.retention`) |
| ``ddpviz:tune:{tune_id}`` | string | a stored `ddpviz tune` report, JSON (see `workers.tunes`) |
| ``ddpviz:tunes`` | sorted set | tune ids scored by stored time (unix seconds) |

Each worker also serves its own RQ queue ``ddpviz:node:{name}``, where `workers.jobs.multinode` puts
the node jobs of multi-host runs; a node job's RQ id is ``{run_id}-n{index}`` (`node_job_id`).
"""

from __future__ import annotations

import json
import re

PREFIX = "ddpviz:"
QUEUE_NAME = "ddpviz"  # the RQ queue every run is enqueued on
RQ_KEY_PREFIX = PREFIX + "rq"  # RQ's keys become ddpviz:rq:queue:ddpviz, ddpviz:rq:job:{id}, ...

RUNS = PREFIX + "runs"
WORKERS = PREFIX + "workers"
STARTED = PREFIX + "started"
RETENTION = PREFIX + "retention"
TUNES = PREFIX + "tunes"
APP_URL = PREFIX + "app_url"  # where `ddpviz up` serves the app (a string; gone when `up` stops)

EVENT_FIELD = b"e"  # the single stream field holding an event's JSON


def run(run_id: str) -> str:
    """Hash of one run record."""
    return f"{PREFIX}run:{run_id}"


def events(run_id: str) -> str:
    """Stream of one run's events."""
    return f"{PREFIX}events:{run_id}"


def tune(tune_id: str) -> str:
    """String holding one stored `ddpviz tune` report (JSON)."""
    return f"{PREFIX}tune:{tune_id}"


def cancel(run_id: str) -> str:
    """Flag set while a cancel of the run is requested (polled by the running job)."""
    return f"{PREFIX}cancel:{run_id}"


ATTACH_LAUNCHER = "ddpviz-run@"  # worker-name prefix of an attached run's launcher (`ddpviz run`)


def attach_launcher(host: str, pid: int) -> str:
    """The name an attached run's launcher keeps a heartbeat under (`worker(name)`, never in
    WORKERS: it takes no jobs), so a killed launcher's run is judged lost as a dead worker's is."""
    return f"{ATTACH_LAUNCHER}{host}:{pid}"


def worker(name: str) -> str:
    """Heartbeat hash of one worker."""
    return f"{PREFIX}worker:{name}"


def node_queue(worker_name: str) -> str:
    """Name of the RQ queue only worker `worker_name` serves (node jobs of multi-host runs)."""
    return f"{PREFIX}node:{worker_name}"


def nodes(run_id: str) -> str:
    """Hash of a multi-host run's per-node state: endpoint, plans, ranks, results."""
    return f"{PREFIX}nodes:{run_id}"


def device_lease(host: str, device: str) -> str:
    """Lease of one device of one host (`device` is a GPU UUID), held by the run using it."""
    return f"{PREFIX}lease:{host}:{device}"


_NODE_JOB_ID = re.compile(r"^(?P<run_id>[0-9a-f]+)-n(?P<index>\d+)$")


def node_job_id(run_id: str, index: int) -> str:
    """RQ job id of node `index` of run `run_id`: ``{run_id}-n{index}``."""
    return f"{run_id}-n{index}"


def parse_node_job_id(job_id: str) -> tuple[str, int] | None:
    """``(run_id, index)`` of a node job id, or None for an ordinary run's job id."""
    m = _NODE_JOB_ID.match(job_id or "")
    return (m["run_id"], int(m["index"])) if m else None


_PAIR_JOB_ID = re.compile(r"^(?P<dp>[0-9a-f]+)-turns-(?P<ddp>[0-9a-f]+)$")


def pair_job_id(dp_run_id: str, ddp_run_id: str) -> str:
    """RQ job id of a DP+DDP pair trained in turns (`workers.jobs.pair`): ``{dp}-turns-{ddp}``."""
    return f"{dp_run_id}-turns-{ddp_run_id}"


def parse_pair_job_id(job_id: str) -> tuple[str, str] | None:
    """``(dp_run_id, ddp_run_id)`` of a pair job id, or None for any other job id."""
    m = _PAIR_JOB_ID.match(job_id or "")
    return (m["dp"], m["ddp"]) if m else None


def pair_or_run(job_id: str) -> list[str]:
    """Both run ids of a pair job, else ``[job_id]`` (an ordinary run's job id is its run id)."""
    pair = parse_pair_job_id(job_id)
    return list(pair) if pair else [job_id]


def job_run_ids(job_id: str) -> list[str]:
    """The run ids an RQ job carries: both runs of a pair job, the run of a node job, else the
    job id itself (an ordinary run's job id is its run id)."""
    if parse_pair_job_id(job_id):
        return pair_or_run(job_id)
    node = parse_node_job_id(job_id)
    return [node[0]] if node else [job_id]


def rq_job_ids(connection, run_id: str) -> list[str]:
    """The RQ job ids that carry run `run_id`: its node jobs, its pair's job (a pair in turns
    shares one job, `workers.jobs.pair`), or the run id itself."""
    raw, pair = connection.hmget(run(run_id), "hosts", "pair")
    hosts = json.loads(raw) if raw else None
    if hosts:
        return [h["job_id"] for h in hosts]
    job_id = (json.loads(pair) or {}).get("job_id") if pair else None
    return [job_id] if job_id else [run_id]
