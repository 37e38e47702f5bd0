"""The client API the app codes against: submit, read, cancel (queued), health."""

from __future__ import annotations

import json
import subprocess
import sys
import zlib

import pytest
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from ddpviz.engine.config import ConfigError
from ddpviz.workers import keys
from ddpviz.workers.client import DdpvizClient
from ddpviz.workers.heartbeat import Heartbeat
from ddpviz.workers.jobs.run import JOB_FUNC, JOB_TIMEOUT_GRACE_S, JOB_TIMEOUT_S

CFG = {"mode": "ddp", "world_size": 2, "steps": 10}


@pytest.fixture
def client(redis_client):
    return DdpvizClient(redis=redis_client)


def test_import_client_does_not_load_torch():
    code = ("import sys, workers.client; "
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_client_connects_from_url(redis_url):
    client = DdpvizClient(url=redis_url)
    assert client.ping()


def test_submit_refuses_bad_config_naming_the_field(client, redis_client):
    with pytest.raises(ConfigError, match="world_size") as info:
        client.submit({**CFG, "world_size": 0})
    assert info.value.errors[0][0] == "world_size"
    with pytest.raises(ConfigError, match="bucket_cap_mb"):
        client.submit_pair({**CFG, "bucket_cap_mb": -1})
    assert redis_client.keys("*") == []  # nothing stored, nothing enqueued


def test_submit_stores_a_queued_run_and_a_json_job(client, redis_client):
    run_id = client.submit(CFG, label="mine")
    rec = client.get_run(run_id)
    assert rec["status"] == "queued" and rec["label"] == "mine" and rec["group"] is None
    assert rec["config"]["world_size"] == 2 and rec["config"]["bucket_cap_mb"] == 25.0  # normalised: the default filled in
    job = Job.fetch(run_id, connection=redis_client, serializer=JSONSerializer)
    assert job.id == run_id and job.func_name == JOB_FUNC and job.args == [run_id]
    assert job.kwargs == {} and job.origin == keys.QUEUE_NAME
    assert job.timeout == JOB_TIMEOUT_S + JOB_TIMEOUT_GRACE_S  # RQ's backstop past the run's own limit
    assert job.get_status() == JobStatus.QUEUED
    raw = redis_client.hget(f"ddpviz:rq:job:{run_id}", "data")
    payload = json.loads(zlib.decompress(raw))  # JSON, never pickle
    assert payload[0] == JOB_FUNC and run_id in json.dumps(payload)
    assert client.queue.job_ids == [run_id]


def test_submit_pair_shares_a_group(client):
    dp_id, ddp_id = client.submit_pair({**CFG, "mode": "single"})
    dp, ddp = client.get_run(dp_id), client.get_run(ddp_id)
    assert (dp["config"]["mode"], dp["label"]) == ("dp", "DP")
    assert (ddp["config"]["mode"], ddp["label"]) == ("ddp", "DDP")
    assert dp["group"] and dp["group"] == ddp["group"]
    assert {k: v for k, v in dp["config"].items() if k != "mode"} == \
           {k: v for k, v in ddp["config"].items() if k != "mode"}
    assert [r["run_id"] for r in client.list_runs()] in ([ddp_id, dp_id], [dp_id, ddp_id])
    # one job trains both at once, in turns (workers.jobs.pair); both records carry the plan
    assert client.queue.job_ids == [f"{dp_id}-turns-{ddp_id}"]
    assert dp["pair"] == ddp["pair"] and dp["pair"]["runs"] == [dp_id, ddp_id]


def test_cancel_a_queued_run(client, redis_client):
    run_id = client.submit(CFG)
    assert client.cancel(run_id) == "canceled"
    rec = client.get_run(run_id)
    assert rec["status"] == "canceled" and "queued" in rec["error"]["exception"]
    assert rec["finished_at"] >= rec["created_at"]
    assert Job.fetch(run_id, connection=redis_client,
                     serializer=JSONSerializer).get_status() == JobStatus.CANCELED
    assert client.queue.job_ids == []
    events, _ = client.read_events(run_id)
    assert [(e["type"], e["status"]) for e in events] == [("run_finished", "canceled")]
    assert client.cancel(run_id) == "canceled"  # idempotent
    assert len(client.read_events(run_id)[0]) == 1


def test_cancel_keeps_a_terminal_status_and_refuses_unknown_runs(client):
    run_id = client.submit(CFG)
    client.store.mark_started(run_id, "w")
    from ddpviz.workers.store import RunStatus

    client.store.finish(run_id, RunStatus.SUCCEEDED, summary={})
    assert client.cancel(run_id) == "succeeded"
    with pytest.raises(KeyError):
        client.cancel("nope")


def test_workers_lists_live_heartbeats(client, redis_client):
    assert client.workers() == []
    beat = Heartbeat(redis_client, "w1", lambda: ("r9", "busy"),
                     [{"name": "cpu", "kind": "cpu", "total_memory_bytes": 1}], ttl_s=1)
    beat.beat()
    (w,) = client.workers()
    assert w["name"] == "w1" and w["current_run"] == "r9" and w["state"] == "busy"
    assert w["devices"][0]["kind"] == "cpu" and w["pid"] > 0 and w["host"] and w["ts"] > 0
    redis_client.delete(keys.worker("w1"))  # as when its TTL runs out
    assert client.workers() == []
    assert redis_client.smembers(keys.WORKERS) == set()
