"""The job function and RQ's failure hooks, with a stand-in engine (no torch, no worker)."""

from __future__ import annotations

import os
import signal
import threading
import time
from types import SimpleNamespace

import pytest

import ddpviz.engine.run

from ddpviz import engine  # noqa: E402
from ddpviz.engine.events import make_event
from ddpviz.engine.run import RunResult
from ddpviz.workers.client import DdpvizClient
from ddpviz.workers.host.reaper import RUN_ENV_VAR
from ddpviz.workers.jobs.run import CancelPoller, on_horse_killed, on_job_exception, on_job_stopped, run_job
from ddpviz.workers.store import RunStatus

CFG = {"mode": "single", "world_size": 1, "steps": 4}


@pytest.fixture
def client(redis_client):
    return DdpvizClient(redis=redis_client)


def fake_engine(monkeypatch, outcome="succeeded", raise_exc=None, calls=None):
    """Replace run_training: emits run_started, steps (polling should_stop), run_finished."""

    def run_training(cfg, sink, run_id, *, should_stop=None, workdir=None):
        if calls is not None:
            calls.append((cfg, run_id, os.environ.get(RUN_ENV_VAR)))
        sink.emit(make_event("run_started", run_id, config=cfg.to_json_dict()))
        if raise_exc is not None:
            raise raise_exc
        status = outcome
        for step in range(cfg.steps if outcome != "wait_cancel" else 10_000):
            if should_stop():
                status = "canceled"
                break
            sink.emit(make_event("step", run_id, step=step, loss=1.0, rank=0))
            time.sleep(0.01 if outcome == "wait_cancel" else 0)
        err = {"rank": 0, "exception": "RuntimeError: boom", "traceback": "tb"} if status == "failed" else None
        summary = {"steps_done": cfg.steps}
        sink.emit(make_event("run_finished", run_id, status=status, error=err, summary=summary))
        return RunResult(status=status, error=err, summary=summary)

    monkeypatch.setattr(engine.run, "run_training", run_training)


def test_a_run_that_succeeds_is_finished(client, monkeypatch):
    calls = []
    fake_engine(monkeypatch, calls=calls)
    run_id = client.submit(CFG)
    assert run_job(client.redis, run_id, worker_name="w1") == "succeeded"
    rec = client.get_run(run_id)
    assert rec["status"] == "succeeded" and rec["worker"] == "w1"
    assert rec["summary"] == {"steps_done": 4} and rec["error"] is None
    assert rec["created_at"] <= rec["started_at"] <= rec["finished_at"]
    events, _ = client.read_events(run_id)
    assert [e["type"] for e in events] == ["run_started"] + ["step"] * 4 + ["run_finished"]
    (cfg, rid, mark), = calls
    assert rid == run_id and cfg.steps == 4 and mark == run_id  # processes marked for the reaper
    assert os.environ.get(RUN_ENV_VAR) is None  # and the mark removed afterwards


def test_a_run_that_fails_is_failed_with_the_engines_error(client, monkeypatch):
    fake_engine(monkeypatch, outcome="failed")
    run_id = client.submit(CFG)
    assert run_job(client.redis, run_id, worker_name="w1") == "failed"
    assert client.get_run(run_id)["error"]["exception"] == "RuntimeError: boom"


def test_an_engine_that_raises_fails_the_run_and_ends_the_stream(client, monkeypatch):
    fake_engine(monkeypatch, raise_exc=MemoryError("no more"))
    run_id = client.submit(CFG)
    assert run_job(client.redis, run_id, worker_name="w1") == "failed"
    rec = client.get_run(run_id)
    assert rec["error"]["exception"] == "MemoryError: no more" and "Traceback" in rec["error"]["traceback"]
    last = client.tail_events(run_id, 1)[0]
    assert last["type"] == "run_finished" and last["status"] == "failed"


def test_the_cancel_flag_reaches_should_stop(client, monkeypatch):
    fake_engine(monkeypatch, outcome="wait_cancel")
    run_id = client.submit(CFG)
    threading.Timer(0.3, client.store.request_cancel, args=(run_id, "enough")).start()
    t0 = time.monotonic()
    assert run_job(client.redis, run_id, worker_name="w1") == "canceled"
    assert time.monotonic() - t0 < 5
    rec = client.get_run(run_id)
    assert rec["status"] == "canceled" and "enough" in rec["error"]["exception"]
    assert client.store.cancel_reason(run_id) is None


def test_a_run_canceled_while_queued_never_starts(client, monkeypatch):
    calls = []
    fake_engine(monkeypatch, calls=calls)
    run_id = client.submit(CFG)
    client.cancel(run_id)
    assert run_job(client.redis, run_id, worker_name="w1") == "canceled"
    assert calls == [] and client.get_run(run_id)["started_at"] is None


def test_a_stored_config_that_no_longer_validates_fails(client, monkeypatch):
    calls = []
    fake_engine(monkeypatch, calls=calls)
    run_id = client.submit(CFG)
    client.redis.hset(f"ddpviz:run:{run_id}", "config", '{"world_size": 0}')
    assert run_job(client.redis, run_id, worker_name="w1") == "failed"
    assert "world_size" in client.get_run(run_id)["error"]["exception"] and calls == []
    with pytest.raises(LookupError):
        run_job(client.redis, "missing", worker_name="w1")


def test_cancel_poller_asks_redis_at_most_every_interval(monkeypatch):
    """On a clock the test moves (the machine's clock, under load, let the poller ask twice in
    0.35 s once): asked every 2 s of 7 s polled every 0.5 s, never in between."""
    import ddpviz.workers.host.stop as stop

    clock = [1000.0]
    monkeypatch.setattr(stop.time, "monotonic", lambda: clock[0])
    asked = []
    store = SimpleNamespace(cancel_reason=lambda run_id: asked.append(clock[0] - 1000.0))
    poll = CancelPoller(store, "r1", interval_s=2.0)
    for tick in range(15):  # 0 .. 7 s
        clock[0] = 1000.0 + tick * 0.5
        assert poll() is False
    assert asked == [0.0, 2.0, 4.0, 6.0]
    store.cancel_reason = lambda run_id: "stop"
    clock[0] = 1007.5  # not yet due (8 s)
    assert poll() is False
    clock[0] = 1008.0
    assert poll() is True and poll() is True and poll.kind == "cancel"


def _job(redis, run_id):
    return SimpleNamespace(id=run_id, connection=redis)


def test_hooks_settle_runs_rq_ends_abnormally(client, redis_client):
    killed, stopped, abandoned, done = (client.submit(CFG) for _ in range(4))
    for rid in (killed, stopped, abandoned, done):
        client.store.mark_started(rid, "w1")
    client.store.finish(done, RunStatus.SUCCEEDED, summary={})

    on_horse_killed(_job(redis_client, killed), 4242, signal.SIGKILL, None)  # waitpid status
    err = client.get_run(killed)["error"]["exception"]
    assert client.get_run(killed)["status"] == "failed"
    assert "WorkHorseKilled" in err and "SIGKILL" in err and "4242" in err

    on_job_stopped(_job(redis_client, stopped), redis_client)
    assert client.get_run(stopped)["status"] == "canceled"

    class AbandonedJobError(Exception):
        pass

    assert on_job_exception(_job(redis_client, abandoned), AbandonedJobError, AbandonedJobError(), None)
    assert client.get_run(abandoned)["status"] == "lost"  # its worker died: re-queue it
    assert "heartbeats" in client.get_run(abandoned)["error"]["exception"]

    on_horse_killed(_job(redis_client, done), 1, signal.SIGKILL, None)
    assert client.get_run(done)["status"] == "succeeded"  # the first terminal status wins
    for rid in (killed, stopped, abandoned):
        assert client.tail_events(rid, 1)[0]["type"] == "run_finished"
