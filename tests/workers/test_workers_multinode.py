"""Multi-host DDP through the queue: two `ddpviz worker` processes act as two hosts (distinct
worker identities, one rank each, rendezvous over loopback), real Redis, real DDP on gloo."""

from __future__ import annotations

import math
from contextlib import ExitStack, contextmanager

import pytest
from wtools import TINY, cli_env, ddpviz, wait_for, worker_process

from ddpviz.engine.config import ConfigError
from ddpviz.workers.client import DdpvizClient
from ddpviz.workers.heartbeat import Heartbeat
from ddpviz.workers.host.reaper import RUN_ENV_VAR, processes_with_env
from ddpviz.workers.jobs.multinode import NotEnoughWorkers, node_job_id, parse_node_job_id, pick_workers
from ddpviz.workers.jobs.nodes import is_echo, merge_endings
from ddpviz.workers.store import TERMINAL, RunStatus

HOSTS = ("hostA", "hostB")
MULTI = {**TINY, "mode": "ddp", "world_size": 2, "nnodes": 2, "steps": 6, "lr": 0.1, "optimizer": "sgd",
         "bucket_cap_mb": 0.005, "step_delay_s": 0.0}


@pytest.fixture
def client(redis_client):
    return DdpvizClient(redis=redis_client)


@contextmanager
def two_hosts(client: DdpvizClient, redis_url: str, tmp_path):
    """Two live workers named hostA and hostB (their logs in tmp_path)."""
    with ExitStack() as stack:
        for name in HOSTS:
            stack.enter_context(worker_process(redis_url, burst=False, name=name,
                                               log_path=tmp_path / f"{name}.log"))
        wait_for(lambda: {w["name"] for w in client.workers() if w["state"] == "idle"} >= set(HOSTS),
                 90, "two idle workers")  # each imports torch first (warm_up)
        yield


def wait_ended(client: DdpvizClient, run_id: str, tmp_path, timeout_s: float = 90) -> dict:
    def ended():
        rec = client.get_run(run_id)
        return rec if rec["status"] in {s.value for s in TERMINAL} else None

    try:
        return wait_for(ended, timeout_s, f"run {run_id} to end", interval_s=0.2)
    except AssertionError:
        logs = "\n".join(f"--- {h}\n" + (tmp_path / f"{h}.log").read_text()[-3000:] for h in HOSTS)
        raise AssertionError(f"run did not end: {client.get_run(run_id)}\n{logs}") from None


def all_events(client: DdpvizClient, run_id: str) -> list[dict]:
    events, _ = client.read_events(run_id, count=100_000)
    return events


def no_run_processes(run_id: str) -> bool:
    return not any(processes_with_env(RUN_ENV_VAR, node_job_id(run_id, i)) for i in range(2))


# -- picking workers, refusing -----------------------------------------------------------------

def test_pick_workers_takes_idle_workers_on_distinct_hosts_first():
    live = [{"name": "a1", "host": "a", "current_run": None, "state": "idle"},
            {"name": "a2", "host": "a", "current_run": None, "state": "idle"},
            {"name": "b1", "host": "b", "current_run": "r1", "state": "busy"},
            {"name": "c1", "host": "c", "current_run": None, "state": "idle"}]
    assert [w["name"] for w in pick_workers(live, 2)] == ["a1", "c1"]
    assert [w["name"] for w in pick_workers(live, 3)] == ["a1", "c1", "a2"]  # then same host
    with pytest.raises(NotEnoughWorkers) as exc:
        pick_workers(live, 4)
    assert exc.value.errors[0][0] == "nnodes"
    assert "needs 4 idle workers" in str(exc.value) and "b1 (busy with r1)" in str(exc.value)


def test_a_run_needing_more_hosts_than_live_workers_is_refused(client, redis_client, redis_url):
    Heartbeat(redis_client, "hostA", lambda: (None, "idle"), []).beat()  # one live worker
    with pytest.raises(ConfigError) as exc:
        client.submit(MULTI)
    assert exc.value.errors[0][0] == "nnodes" and "1 idle (hostA)" in str(exc.value)
    assert client.list_runs() == []  # nothing stored, nothing queued
    out = ddpviz("submit", "--nnodes", "2", "--world-size", "2", env=cli_env(redis_url))
    assert out.returncode == 2 and "nnodes=2 needs 2 idle workers" in out.stderr, out.stderr


def test_a_queued_multi_host_run_is_split_per_worker_and_cancels_every_node_job(client, redis_client):
    from rq.job import Job, JobStatus
    from rq.serializers import JSONSerializer

    for name in HOSTS:
        Heartbeat(redis_client, name, lambda: (None, "idle"), []).beat()
    run_id = client.submit({**MULTI, "world_size": 4})
    rec = client.get_run(run_id)
    assert rec["status"] == "queued" and rec["worker"] == "hostA"
    assert [(h["node"], h["worker"], h["nproc"]) for h in rec["hosts"]] == [(0, "hostA", 2), (1, "hostB", 2)]
    for i, name in enumerate(HOSTS):  # each node job waits on its own worker's queue
        assert redis_client.lrange(f"ddpviz:rq:queue:ddpviz:node:{name}", 0, -1) == \
            [node_job_id(run_id, i).encode()]
    assert client.cancel(run_id) == "canceled"
    for i in range(2):
        job = Job.fetch(node_job_id(run_id, i), connection=redis_client, serializer=JSONSerializer)
        assert job.get_status() == JobStatus.CANCELED
    assert [e["type"] for e in all_events(client, run_id)] == ["run_finished"]


def test_root_cause_is_the_failure_not_the_peer_closed_echo():
    echo = {"rank": 0, "exception": "RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection "
                                    "closed by peer [127.0.0.1]:1234", "traceback": "", "host": "hostA"}
    cause = {"rank": 1, "exception": "InjectedFault: rank 1 raised at step 2", "traceback": "tb"}
    results = {0: {"status": "failed", "error": echo, "worker": "hostA", "ts": 1.0},
               1: {"status": "failed", "error": cause, "worker": "hostB", "ts": 2.0}}
    assert is_echo(echo) and not is_echo(cause)
    status, err = merge_endings(results)
    assert status.value == "failed" and err["exception"] == cause["exception"] and err["host"] == "hostB"
    assert err["other_hosts"] == [{"host": "hostA", "rank": 0, "exception": echo["exception"]}]
    # a user's cancel on one host is the cause of the peer-closed failure on the other
    user = {"rank": None, "exception": "Canceled: canceled by user", "traceback": None}
    status, err = merge_endings({0: {"status": "failed", "error": echo, "worker": "hostA", "ts": 1.0},
                                 1: {"status": "canceled", "error": user, "worker": "hostB", "ts": 2.0}})
    assert status.value == "canceled" and err["exception"] == user["exception"]
    assert merge_endings({0: {"status": "succeeded", "error": None, "worker": "a", "ts": 1.0}}) == \
        (RunStatus.SUCCEEDED, None)
    assert parse_node_job_id(node_job_id("0123abcd0123abcd", 1)) == ("0123abcd0123abcd", 1)
    assert parse_node_job_id("0123abcd0123abcd") is None


# -- real runs on two workers ------------------------------------------------------------------

@pytest.mark.slow
def test_a_two_host_run_trains_as_one_ddp_run(client, redis_url, tmp_path):
    from ddpviz.engine.config import RunConfig
    from ddpviz.engine.events import ListSink
    from ddpviz.engine.run import run_training

    with two_hosts(client, redis_url, tmp_path):
        run_id = client.submit(MULTI, label="2 hosts")
        rec = wait_ended(client, run_id, tmp_path)
        assert rec["status"] == "succeeded", rec
        wait_for(lambda: no_run_processes(run_id), 20, "the node jobs' processes to exit")
    events = all_events(client, run_id)
    types = [e["type"] for e in events]
    assert types[0] == "run_started" and types.count("run_started") == 1
    assert types[-1] == "run_finished" and types.count("run_finished") == 1
    started = events[0]
    assert [h["worker"] for h in started["hosts"]] == list(HOSTS) and started["nnodes"] == 2
    assert {d["host"] for d in started["devices"]} == set(HOSTS) and len(started["device_names"]) == 2
    steps = [e for e in events if e["type"] == "step"]
    rank_host = {(e["rank"], e["host"]) for e in steps}
    assert {r for r, _ in rank_host} == {0, 1} and {h for _, h in rank_host} == set(HOSTS)
    assert len(rank_host) == 2  # each rank on one host
    assert {e["host"] for e in events if e["type"] == "bucket"} == set(HOSTS)
    # the record: which ranks and devices each host had
    hosts = {h["worker"]: h for h in rec["hosts"]}
    assert sorted(r for h in hosts.values() for r in h["ranks"]) == [0, 1]
    for rank, host in rank_host:
        assert hosts[host]["ranks"] == [rank] and hosts[host]["device_names"] == ["cpu:0"]
    assert rec["worker"] == "hostA" and rec["error"] is None  # node 0's worker; all are in hosts
    # replicas in sync, and equal to single-device training on the same global batch
    summary = rec["summary"]
    assert summary["steps_done"] == MULTI["steps"] and summary["replicas_in_sync"] is True
    devices = {f"{e['host']}/{e['device']}" for e in steps}  # GPUs repeat across hosts: qualified
    assert set(summary["peak_memory_bytes"]) == set(summary["bytes_per_device"]) == devices
    a, b = summary["param_checksums"]
    assert a == b
    single = ListSink()
    run_training(RunConfig(**{**MULTI, "mode": "single", "world_size": 1, "nnodes": 1}), single, "s")
    (ref,) = single.of_type("sync")[-1]["checksums"]
    assert all(math.isclose(x, y, rel_tol=1e-5) for x, y in zip(a, ref)), (a, ref)


@pytest.mark.slow
def test_a_failure_on_one_host_fails_the_run_on_both_with_the_root_cause(client, redis_url, tmp_path):
    fields = {**MULTI, "steps": 200, "fault": "raise", "fault_rank": 1, "fault_step": 2,
              "collective_timeout_s": 10}
    with two_hosts(client, redis_url, tmp_path):
        run_id = client.submit(fields)
        rec = wait_ended(client, run_id, tmp_path)
        wait_for(lambda: no_run_processes(run_id), 20, "both hosts' rank processes to exit")
    assert rec["status"] == "failed"
    err = rec["error"]
    assert "rank 1 raised at step 2" in err["exception"] and err["rank"] == 1, err
    rank1_host = next(h["worker"] for h in rec["hosts"] if h["ranks"] == [1])
    assert err["host"] == rank1_host
    (other,) = err["other_hosts"]  # the other host failed too, as an echo of this one
    assert other["host"] != rank1_host and is_echo(other)
    events = all_events(client, run_id)
    finished = [e for e in events if e["type"] == "run_finished"]
    assert len(finished) == 1 and events[-1] is finished[0]
    assert finished[0]["status"] == "failed" and "rank 1 raised" in finished[0]["error"]["exception"]


@pytest.mark.slow
def test_cancel_stops_every_host(client, redis_url, tmp_path):
    fields = {**MULTI, "steps": 5000, "step_delay_s": 0.05}
    with two_hosts(client, redis_url, tmp_path):
        run_id = client.submit(fields)
        wait_for(lambda: {e.get("host") for e in all_events(client, run_id) if e["type"] == "step"}
                 == set(HOSTS), 60, "steps from both hosts")
        wait_for(lambda: {w["current_run"] for w in client.workers()} == {run_id}, 10,
                 "both workers' heartbeats to name the run (not its node jobs)")
        assert client.cancel(run_id) == "canceled"
        wait_for(lambda: no_run_processes(run_id), 20, "both hosts' rank processes to exit")
        wait_for(lambda: all(not w["current_run"] for w in client.workers()), 30, "idle workers")
    rec = client.get_run(run_id)
    assert rec["status"] == "canceled" and "Canceled" in rec["error"]["exception"]
    assert [e["type"] for e in all_events(client, run_id)].count("run_finished") == 1


def test_a_host_whose_worker_vanished_is_the_root_cause(client, redis_client):
    """Settling without DDP: node 0 reported a peer-closed failure, node 1's worker stopped
    beating. The run fails with HostLost on node 1, once, as soon as its heartbeat is gone."""
    from ddpviz.workers.jobs.nodes import NodeState, settle_when_all_report

    for name in HOSTS:
        Heartbeat(redis_client, name, lambda: (None, "idle"), []).beat()
    run_id = client.submit(MULTI)
    redis_client.delete(f"ddpviz:worker:{HOSTS[1]}")  # hostB's heartbeat expired
    echo = {"rank": 0, "exception": "RuntimeError: Connection reset by peer", "traceback": ""}
    NodeState(redis_client, run_id).record_result(0, RunStatus.FAILED, echo, None, HOSTS[0])
    settle_when_all_report(redis_client, run_id, wait_s=30)
    rec = client.get_run(run_id)
    assert rec["status"] == "failed" and rec["error"]["exception"].startswith("HostLost: worker hostB")
    assert rec["error"]["host"] == "hostB" and rec["error"]["other_hosts"][0]["host"] == "hostA"
    assert [e["type"] for e in all_events(client, run_id)] == ["run_finished"]


@pytest.mark.slow
def test_stopping_one_hosts_worker_cancels_the_run_on_every_host(client, redis_url, tmp_path):
    import signal

    fields = {**MULTI, "steps": 5000, "step_delay_s": 0.05}
    with ExitStack() as stack:
        procs = {name: stack.enter_context(worker_process(redis_url, burst=False, name=name,
                                                          log_path=tmp_path / f"{name}.log"))
                 for name in HOSTS}
        wait_for(lambda: {w["name"] for w in client.workers() if w["state"] == "idle"} >= set(HOSTS),
                 90, "two idle workers")  # each imports torch first (warm_up)
        run_id = client.submit(fields)
        wait_for(lambda: {e.get("host") for e in all_events(client, run_id) if e["type"] == "step"}
                 == set(HOSTS), 60, "steps from both hosts")
        procs["hostB"].send_signal(signal.SIGTERM)  # what `docker compose stop` does
        rec = wait_ended(client, run_id, tmp_path, timeout_s=30)
        assert procs["hostB"].wait(30) == 0
        wait_for(lambda: no_run_processes(run_id), 20, "both hosts' rank processes to exit")
    assert rec["status"] == "canceled", rec["error"]
    assert "the worker is shutting down" in rec["error"]["exception"] and rec["error"]["host"] == "hostB"
    assert [e["type"] for e in all_events(client, run_id)].count("run_finished") == 1


def test_node_0_merges_every_hosts_plan_and_refuses_mixed_backends(client, redis_client):
    """Node 0's run_started carries every host's devices; hosts that resolved different
    backends (one with GPUs, one without) are refused before any rank starts."""
    from ddpviz.engine.components.devices import PreflightError
    from ddpviz.engine.events import make_event
    from ddpviz.workers.jobs.node import NodeSink
    from ddpviz.workers.jobs.nodes import NodeState

    for name in HOSTS:
        Heartbeat(redis_client, name, lambda: (None, "idle"), []).beat()
    run_id = client.submit(MULTI)
    hosts = client.get_run(run_id)["hosts"]
    cpu = {"name": "virtual CPU device 0", "kind": "cpu", "total_memory_bytes": 1}
    started = make_event("run_started", run_id, rank=0, backend="gloo", devices=[cpu],
                         device_names=["cpu:0"], host="hostA", hostname="machine-a")  # as the engine
    state = NodeState(redis_client, run_id)
    state.publish_plan(1, {"hostname": "machine-b", "backend": "gloo", "devices": [cpu], "device_names": ["cpu:0"]})
    sink = NodeSink(redis_client, run_id, 0, hosts, "hostA", stop=lambda: False)
    sink.emit(dict(started))
    sink.close()
    (merged,) = all_events(client, run_id)
    assert merged["nnodes"] == 2 and [d["host"] for d in merged["devices"]] == list(HOSTS)
    assert [h["hostname"] for h in merged["hosts"]] == ["machine-a", "machine-b"]
    assert (merged["host"], merged["hostname"]) == ("hostA", "machine-a")  # host: a worker, as on every event
    assert [h["devices"] for h in client.get_run(run_id)["hosts"]] == [[cpu], [cpu]]
    assert [h["hostname"] for h in client.get_run(run_id)["hosts"]] == ["machine-a", "machine-b"]
    assert client.get_run(run_id)["started"]["nnodes"] == 2  # kept in the record too

    state.publish_plan(1, {"hostname": "machine-b", "backend": "nccl", "devices": [], "device_names": ["cuda:0"]})
    sink = NodeSink(redis_client, run_id, 0, hosts, "hostA", stop=lambda: False)
    with pytest.raises(PreflightError, match="different backends.*hostA: gloo.*hostB: nccl"):
        sink.emit(dict(started))
    sink.close()
