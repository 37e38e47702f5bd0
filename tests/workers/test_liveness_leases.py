"""Lost runs (the client's check, the workers' monitor, revival, re-queue), GPU leases, NVML
figures in heartbeats, and the stream writer's outage buffer — against a real Redis, in-process."""

from __future__ import annotations

import os
import sys
import threading
import time
import types

import pytest
from wtools import wait_for

import ddpviz.engine.run

from ddpviz import engine  # noqa: E402
from ddpviz.engine.events import make_event
from ddpviz.engine.run import RunResult
from ddpviz.workers import keys
from ddpviz.workers.client import DdpvizClient
from ddpviz.workers.connection import EmbeddedRedis, connect
from ddpviz.workers.heartbeat import Heartbeat, read_workers
from ddpviz.workers.host.gpus import GpuMonitor, visible
from ddpviz.workers.host.leases import DeviceLease, gpus_needed
from ddpviz.workers.host.reaper import RUN_ENV_VAR
from ddpviz.workers.host.stop import fast_fail
from ddpviz.workers.jobs.run import run_job
from ddpviz.workers.liveness import LOST_GRACE_S, LostRunMonitor
from ddpviz.workers.sink import RedisStreamWriter
from ddpviz.workers.store import RunStatus

CFG = {"mode": "single", "world_size": 1, "steps": 4}


@pytest.fixture
def client(redis_client):
    return DdpvizClient(redis=redis_client)


def started_long_ago(client: DdpvizClient, worker: str, age_s: float = LOST_GRACE_S + 5) -> str:
    run_id = client.submit(CFG)
    client.store.mark_started(run_id, worker)
    client.redis.hset(keys.run(run_id), "started_at", repr(time.time() - age_s))
    return run_id


def beat(client: DdpvizClient, name: str) -> None:
    Heartbeat(client.redis, name, lambda: (None, "busy"), []).beat()


# -- lost runs ----------------------------------------------------------------------------------

def test_the_client_marks_a_started_run_of_a_dead_worker_lost(client):
    dead = started_long_ago(client, "ghost")
    young = started_long_ago(client, "ghost", age_s=1.0)  # its worker may not have beaten yet
    beat(client, "alive")
    healthy = started_long_ago(client, "alive")
    assert client.get_run(dead)["status"] == "lost"
    assert client.get_run(young)["status"] == "started"
    assert client.get_run(healthy)["status"] == "started"
    err = client.get_run(dead)["error"]["exception"]
    assert "ghost" in err and f"ddpviz requeue {dead}" in err
    last = client.tail_events(dead, 1)[0]
    assert last["type"] == "run_finished" and last["status"] == "lost"
    assert {r["run_id"]: r["status"] for r in client.list_runs()}[dead] == "lost"
    assert dead.encode() not in client.redis.smembers(keys.STARTED)


def test_the_monitor_needs_two_sweeps_never_judges_its_own_run_and_revives_it(client):
    other = started_long_ago(client, "ghost")
    mine = started_long_ago(client, "me")
    current = {"run": mine}
    monitor = LostRunMonitor(client.store, "me", lambda: current["run"], confirm_s=3.0)
    now = time.time()
    assert monitor.sweep(now) == []  # first sighting: a suspect only
    assert client.store.status(other) is RunStatus.STARTED
    assert monitor.sweep(now + 3.0) == [other]
    assert client.store.status(mine) is RunStatus.STARTED  # its own run is never judged
    # judged lost by another worker while this one was cut off from Redis: it comes back
    assert client.store.mark_lost(mine, {"rank": None, "exception": "WorkerLost: test", "traceback": None})
    monitor.sweep()
    rec = client.store.get(mine)
    assert rec["status"] == "started" and rec["error"] is None and rec["finished_at"] is None
    assert client.tail_events(mine, 1)[0]["type"] == "log"


def test_a_job_that_outlives_a_lost_verdict_records_how_it_really_ended(client, monkeypatch):
    def run_training(cfg, sink, run_id, *, should_stop=None, workdir=None):
        client.store.mark_lost(run_id, {"rank": None, "exception": "WorkerLost", "traceback": None})
        sink.emit(make_event("run_finished", run_id, status="succeeded", error=None, summary={}))
        return RunResult(status="succeeded", summary={"steps_done": 4})

    monkeypatch.setattr(engine.run, "run_training", run_training)
    run_id = client.submit(CFG)
    assert run_job(client.redis, run_id, worker_name="w1") == "succeeded"


def test_requeue_submits_an_ended_run_again(client):
    run_id = client.submit(CFG, label="again", timeout_s=120)
    client.store.mark_started(run_id, "ghost")
    with pytest.raises(ValueError, match="cancel it first"):
        client.requeue(run_id)
    client.store.mark_lost(run_id, {"rank": None, "exception": "WorkerLost", "traceback": None})
    new_id = client.requeue(run_id)
    new, old = client.get_run(new_id), client.get_run(run_id)
    assert new["status"] == "queued" and new["config"] == old["config"] and new["label"] == "again"
    assert new["timeout_s"] == 120 and new["requeued_from"] == run_id and old["requeued_as"] == new_id
    assert client.queue.job_ids == [run_id, new_id] or new_id in client.queue.job_ids
    with pytest.raises(KeyError):
        client.requeue("nope")


# -- GPU leases ---------------------------------------------------------------------------------

def test_gpus_needed_mirrors_the_engines_device_rule():
    cfg = lambda **kw: types.SimpleNamespace(**{"mode": "ddp", "world_size": 2, "nnodes": 1,
                                                "device": "auto", **kw})
    assert gpus_needed(cfg(), 4) == 2 and gpus_needed(cfg(), 1) == 0
    assert gpus_needed(cfg(device="cpu"), 8) == 0 and gpus_needed(cfg(device="cuda"), 0) == 2
    assert gpus_needed(cfg(mode="single", world_size=4), 1) == 1
    assert gpus_needed(cfg(world_size=4, nnodes=2), 2) == 2


def test_leases_never_share_a_gpu_and_expire_when_not_refreshed(redis_client):
    gpus = ["GPU-a", "GPU-b", "GPU-c"]
    a, b = DeviceLease(redis_client, "h1", "run-a"), DeviceLease(redis_client, "h1", "run-b", ttl_s=0.5)
    assert a.try_acquire(gpus, 2) == ["GPU-a", "GPU-b"]
    assert b.try_acquire(gpus, 2) is None  # only one left: all or nothing
    assert b.holders(gpus) == ["run-a"]
    assert DeviceLease(redis_client, "h2", "run-x").try_acquire(gpus, 3) == gpus  # another host
    a.release()
    assert b.try_acquire(gpus, 2) == ["GPU-a", "GPU-b"]  # never refreshed: gone after its TTL
    time.sleep(0.7)
    assert DeviceLease(redis_client, "h1", "run-c").try_acquire(gpus, 3) == gpus


def test_a_run_that_lost_its_lease_neither_refreshes_nor_frees_the_new_holders(redis_client):
    """A lease that expired and was taken by another run belongs to that run: the old holder's
    refresh leaves its TTL alone and its release leaves the key (checked with Redis's own PTTL/GET)."""
    old = DeviceLease(redis_client, "h1", "run-old", ttl_s=0.3)
    assert old.try_acquire(["GPU-a"], 1) == ["GPU-a"]
    time.sleep(0.4)  # expired: never refreshed
    new = DeviceLease(redis_client, "h1", "run-new", ttl_s=60)
    assert new.try_acquire(["GPU-a"], 1) == ["GPU-a"]
    key = keys.device_lease("h1", "GPU-a")
    redis_client.pexpire(key, 10_000)
    old._refresh()
    assert 5_000 < redis_client.pttl(key) <= 10_000  # the old run did not shorten it to its 0.3 s TTL
    assert redis_client.get(key) == b"run-new"
    old.release()
    assert redis_client.get(key) == b"run-new"
    new.release()
    assert redis_client.get(key) is None


def test_two_runs_wanting_all_gpus_take_turns(client, monkeypatch):
    """Two jobs on one host with 2 GPUs, each wanting both: the second waits (and says so) until
    the first releases them, then runs with exactly those GPUs visible."""
    for var in (RUN_ENV_VAR, "CUDA_VISIBLE_DEVICES"):  # two jobs in one process share os.environ
        monkeypatch.setenv(var, "")  # (in a worker each has its own horse): restored at teardown
        monkeypatch.delenv(var)
    monkeypatch.setattr(GpuMonitor, "inventory", lambda self: [
        {"index": 0, "uuid": "GPU-0000", "name": "fake"}, {"index": 1, "uuid": "GPU-1111", "name": "fake"}])
    release_a, seen = threading.Event(), {}

    def run_training(cfg, sink, run_id, *, should_stop=None, workdir=None):
        seen[run_id] = (os.environ.get("CUDA_VISIBLE_DEVICES"), time.monotonic())
        if len(seen) == 1:
            release_a.wait(30)
        return RunResult(status="succeeded", summary={})

    monkeypatch.setattr(engine.run, "run_training", run_training)
    cfg = {"mode": "ddp", "world_size": 2, "device": "cuda", "steps": 4}
    a, b = client.submit(cfg), client.submit(cfg)
    ta = threading.Thread(target=run_job, args=(client.redis, a), kwargs={"worker_name": "w1"})
    ta.start()
    wait_for(lambda: a in seen, 10, "run a to hold both GPUs")
    tb = threading.Thread(target=run_job, args=(client.redis, b), kwargs={"worker_name": "w2"})
    tb.start()
    wait_for(lambda: any("waiting for 2 free GPU" in (e.get("message") or "")
                         for e in client.tail_events(b, 5)), 10, "run b to say it waits")
    assert b not in seen
    t_release = time.monotonic()
    release_a.set()
    ta.join(30), tb.join(30)
    assert seen[a][0] == seen[b][0] == "GPU-0000,GPU-1111"
    assert seen[b][1] >= t_release
    assert not redis_keys(client, "ddpviz:lease:*")  # every lease released
    assert client.get_run(a)["status"] == client.get_run(b)["status"] == "succeeded"


def redis_keys(client: DdpvizClient, pattern: str) -> list[bytes]:
    return list(client.redis.scan_iter(match=pattern))


# -- NVML figures in heartbeats -------------------------------------------------------------------

def fake_pynvml(n: int = 2) -> types.ModuleType:
    m = types.ModuleType("pynvml")
    m.nvmlInit = m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetCount = lambda: n
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetUUID = lambda h: f"GPU-{h}{h}{h}"
    m.nvmlDeviceGetName = lambda h: b"NVIDIA H200"
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=(h + 1) * 2**30, total=141 * 2**30)
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=37 + h)
    return m


def test_heartbeats_carry_live_nvml_figures_per_gpu(client, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-111")
    gpus = GpuMonitor()
    Heartbeat(client.redis, "gpu-box", lambda: (None, "idle"), [], gpus=gpus).beat()
    (w,) = client.workers()
    assert w["gpus"] == [{"index": 1, "name": "NVIDIA H200", "memory_used_bytes": 2 * 2**30,
                          "memory_total_bytes": 141 * 2**30, "utilization_pct": 37.0 + 1}]


def test_without_nvml_the_gpu_list_is_empty(client, monkeypatch):
    broken = types.ModuleType("pynvml")

    def fail():
        raise RuntimeError("NVML Shared Library Not Found")

    broken.nvmlInit = fail
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    Heartbeat(client.redis, "cpu-box", lambda: (None, "idle"), [], gpus=GpuMonitor()).beat()
    assert read_workers(client.redis)[0]["gpus"] == []


def test_cuda_visible_devices_selects_gpus_by_index_or_uuid_prefix():
    gpus = [{"index": i, "uuid": f"GPU-{c}"} for i, c in enumerate("abc")]
    assert [g["index"] for g in visible(gpus, "2,0")] == [2, 0]
    assert [g["index"] for g in visible(gpus, "GPU-b")] == [1]
    assert visible(gpus, "") == [] and [g["index"] for g in visible(gpus, "1,7,2")] == [1]


# -- the stream writer through an outage ----------------------------------------------------------

def test_the_writer_keeps_events_in_order_through_an_outage_and_drops_only_past_its_bound(tmp_path):
    server = EmbeddedRedis(tmp_path / "r").start()
    try:
        writer = RedisStreamWriter(fast_fail(connect(server.url)), "w1", max_pending=50)
        writer.write_batch([make_event("run_started", "w1")])
        server.stop()
        for i in range(80):
            writer.write_batch([make_event("step", "w1", step=i)])
        assert len(writer.pending) == 50 and writer.dropped == 30 and writer.problem
        assert "30 events could not be kept" in writer.problem
        server = EmbeddedRedis(server.data_dir, port=server.port).start()
        writer.close()
        events = DdpvizClient(url=server.url).read_events("w1", count=1000)[0]
        assert events[0]["type"] == "run_started"
        assert [e["step"] for e in events[1:]] == list(range(30, 80))
        assert writer.outages_s and writer.pending == type(writer.pending)()
    finally:
        server.stop()
