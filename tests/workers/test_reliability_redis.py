"""Redis going away and coming back: a restart mid-run loses no event, an outage past the bound
fails the run with its cause, and finished runs survive restarts (even a SIGKILL of Redis)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from wmeasure import record
from wtools import TINY, wait_for, worker_process

import ddpviz.engine.run

from ddpviz import engine  # noqa: E402
import ddpviz.workers.jobs.run
from ddpviz import workers  # noqa: E402
import ddpviz.workers.sink
from ddpviz import workers  # noqa: E402
from ddpviz.engine.events import make_event
from ddpviz.engine.run import RunResult
from ddpviz.workers import keys
from ddpviz.workers.client import DdpvizClient
from ddpviz.workers.connection import EmbeddedRedis, connect
from ddpviz.workers.jobs.run import run_job
from ddpviz.workers.store import TERMINAL

ENDED = {s.value for s in TERMINAL}
SINGLE = {**TINY, "mode": "single", "world_size": 1}


def _restart(server: EmbeddedRedis, down_s: float) -> EmbeddedRedis:
    server.stop()  # SIGTERM: redis-server saves and exits
    time.sleep(down_s)
    return EmbeddedRedis(server.data_dir, port=server.port).start()


@pytest.mark.slow
def test_a_redis_restart_mid_run_loses_no_event_and_the_worker_goes_on(tmp_path):
    server = EmbeddedRedis(tmp_path / "redis").start()
    try:
        client = DdpvizClient(url=server.url)
        steps = 120
        run_id = client.submit({**TINY, "mode": "ddp", "world_size": 2, "steps": steps,
                                "step_delay_s": 0.05})
        with worker_process(server.url, burst=False, name="w-restart",
                            log_path=tmp_path / "worker.log") as proc:
            wait_for(lambda: any(e["type"] == "step" for e in client.tail_events(run_id, 50)), 90,
                     "the first DDP step")
            server = _restart(server, down_s=3.0)
            t_up = time.time()
            n_before = client.redis.xlen(keys.events(run_id))
            flowing = wait_for(lambda: client.redis.xlen(keys.events(run_id)) > n_before
                               and time.time(), 30, "the run's events to flow again")
            record("redis_back_to_events_flowing_s", flowing - t_up, "s")
            beat = wait_for(lambda: [w["ts"] for w in client.workers() if w["ts"] > t_up], 30,
                            "the worker's first heartbeat after the restart")
            record("redis_back_to_worker_heartbeat_s", beat[0] - t_up, "s")
            rec = wait_for(lambda: (r := client.get_run(run_id))["status"] in ENDED and r, 120,
                           "the run to end")
            assert rec["status"] == "succeeded", (rec["error"], (tmp_path / "worker.log").read_text()[-3000:])
            events, _ = client.read_events(run_id, count=100_000)
            seen = [(e["rank"], e["step"]) for e in events if e["type"] == "step"]
            assert set(seen) == {(r, s) for r in (0, 1) for s in range(steps)}  # none lost
            record("redis_restart_step_events_lost", 2 * steps - len(set(seen)), "events")
            record("redis_restart_step_events_duplicated", len(seen) - len(set(seen)), "events")
            assert events[-1]["type"] == "run_finished"
            assert proc.poll() is None  # the worker rode it out, and still serves the queue
            again = client.submit(SINGLE)
            wait_for(lambda: client.get_run(again)["status"] == "succeeded", 60, "a run after")
    finally:
        server.stop()


def test_redis_gone_past_the_bound_fails_the_run_with_the_cause(tmp_path, monkeypatch):
    """A real outage against the real writer: with a small bound the run stops, fails naming the
    outage, and its record says so once Redis is back."""
    monkeypatch.setattr(workers.sink, "MAX_PENDING_EVENTS", 300)
    monkeypatch.setattr(workers.jobs.run, "FINISH_RETRY_S", 60.0)

    def run_training(cfg, sink, run_id, *, should_stop=None, workdir=None):
        sink.emit(make_event("run_started", run_id, config=cfg.to_json_dict()))
        step = 0
        while not should_stop():
            for _ in range(20):
                sink.emit(make_event("step", run_id, step=step, rank=0, loss=1.0))
                step += 1
            time.sleep(0.01)
        sink.emit(make_event("run_finished", run_id, status="canceled", error=None, summary={}))
        return RunResult(status="canceled", error={"rank": None, "exception": "stopped"},
                         summary={})

    monkeypatch.setattr(engine.run, "run_training", run_training)
    server = EmbeddedRedis(tmp_path / "redis").start()
    try:
        client = DdpvizClient(url=server.url)
        run_id = client.submit(SINGLE)
        result: list[str] = []
        job = threading.Thread(target=lambda: result.append(
            run_job(connect(server.url), run_id, worker_name="w-gone")))
        job.start()
        wait_for(lambda: client.tail_events(run_id, 1), 30, "the first events")
        server.stop()
        time.sleep(2.0)  # the writer overflows its bound meanwhile; the poller stops the run
        server = EmbeddedRedis(server.data_dir, port=server.port).start()
        job.join(90)
        assert result == ["failed"]
        rec = DdpvizClient(url=server.url).get_run(run_id)
        assert "EventStreamLost" in rec["error"]["exception"], rec["error"]
        assert "could not be kept" in rec["error"]["exception"]
    finally:
        server.stop()


@pytest.mark.slow
def test_finished_runs_survive_restarting_the_worker_and_a_killed_redis(tmp_path):
    data = tmp_path / "redis"
    with EmbeddedRedis(data) as server:
        client = DdpvizClient(url=server.url)
        run_id = client.submit(SINGLE, label="keep")
        with worker_process(server.url, burst=True) as proc:
            assert proc.wait(90) == 0
        before = client.get_run(run_id)
        events_before, _ = client.read_events(run_id, count=100_000)
        assert before["status"] == "succeeded" and events_before[-1]["type"] == "run_finished"
        client.redis.close()
        time.sleep(1.5)  # appendfsync everysec: what was written a second ago is on disk
        os.kill(server.proc.pid, signal.SIGKILL)  # a crash: no save on the way out
        server.proc.wait(10)
    with EmbeddedRedis(data) as server:  # a fresh server on the same folder, a fresh worker
        client = DdpvizClient(url=server.url)
        assert client.get_run(run_id) == before
        assert client.read_events(run_id, count=100_000)[0] == events_before
        again = client.submit(SINGLE)
        with worker_process(server.url, burst=True) as proc:
            assert proc.wait(90) == 0
        assert client.get_run(again)["status"] == "succeeded"
        assert [r["run_id"] for r in client.list_runs()] == [again, run_id]
