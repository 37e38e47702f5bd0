"""`ddpviz up` starts Redis, a worker and the app, and SIGTERM stops every one of them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from wtools import TINY, alive, cli_env, ddpviz_argv, descendants, wait_for

from ddpviz.workers import keys
from ddpviz.workers.client import DdpvizClient
from ddpviz.workers.connection import free_port, user_url_file
from ddpviz.workers.up import default_app_path

pytestmark = pytest.mark.slow


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _start_up(cwd: Path, port: int, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([*ddpviz_argv(), "up", "--port", str(port), *extra], cwd=cwd,
                            env=cli_env(None), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def _stop_and_check(up: subprocess.Popen, family: set[int]) -> str:
    up.send_signal(signal.SIGTERM)
    try:
        out, _ = up.communicate(timeout=45)
    except subprocess.TimeoutExpired:
        up.kill()
        raise
    assert up.returncode == 0, out[-3000:]
    wait_for(lambda: not any(alive(p) for p in family), 10, "every child of `up` to end")
    return out


@pytest.mark.skipif(not default_app_path().is_file(), reason="app/main.py not written yet")
def test_up_serves_the_app_and_sigterm_leaves_nothing_behind(tmp_path):
    port = free_port()
    up = _start_up(tmp_path, port)
    try:
        wait_for(lambda: _healthy(port), 45, "the app's /_stcore/health")
        url = (tmp_path / ".ddpviz" / "redis.url").read_text().strip()
        assert url.startswith("redis://127.0.0.1:")
        client = DdpvizClient(url=url)
        wait_for(client.workers, 20, "the worker's heartbeat")
        # where `ddpviz run` sends people: the address this `up` serves the app at
        assert client.redis.get(keys.APP_URL) == f"http://127.0.0.1:{port}".encode()
        family = set(descendants(up.pid))
        assert len(family) >= 3  # redis-server, worker, streamlit
        # a command of this user in another folder (`ddpviz run` in the user's project) finds this `up`'s Redis
        elsewhere = tmp_path / "project"
        elsewhere.mkdir()
        found = subprocess.run([sys.executable, "-c", "from ddpviz.workers.connection import redis_url; "
                                "print(redis_url())"], cwd=elsewhere, env=cli_env(None), capture_output=True,
                               text=True, timeout=60)
        assert found.stdout.strip() == url, found.stderr
    finally:
        out = _stop_and_check(up, family if "family" in locals() else set())
    assert f"http://127.0.0.1:{port}" in out
    assert not user_url_file().exists()
    assert not (tmp_path / ".ddpviz" / "redis.url").exists()
    assert (tmp_path / ".ddpviz" / "redis" / "appendonly.aof").exists()  # the demo's data persist
    assert not _healthy(port)


def test_up_restarts_a_killed_worker_and_sigterm_stops_a_running_ddp_run_and_its_ranks(tmp_path):
    """A SIGKILLed worker is restarted (its heartbeat comes back under a new pid), the restarted worker
    runs a DDP job, and SIGTERM to `up` cancels that run and leaves none of its processes."""
    app = tmp_path / "tiny_app.py"
    app.write_text("import streamlit as st\nst.write('ddpviz test app')\n")
    port = free_port()
    up = _start_up(tmp_path, port, "--app", str(app))
    family: set[int] = set()
    try:
        url = wait_for(lambda: (tmp_path / ".ddpviz" / "redis.url").is_file()
                       and (tmp_path / ".ddpviz" / "redis.url").read_text().strip(), 30, "Redis")
        client = DdpvizClient(url=url)
        first = wait_for(client.workers, 30, "the worker's heartbeat")[0]
        os.kill(first["pid"], signal.SIGKILL)
        wait_for(lambda: any(w["pid"] != first["pid"] and w["name"].endswith("-restart1")
                             for w in client.workers()), 45, "the restarted worker's heartbeat")
        run_id = client.submit({**TINY, "mode": "ddp", "world_size": 2, "steps": 2000,
                                "step_delay_s": 0.05})
        wait_for(lambda: any(e["type"] == "step" for e in client.tail_events(run_id, 50)), 60,
                 "the first DDP step on the restarted worker")
        wait_for(lambda: _healthy(port), 45, "the app")
        family = set(descendants(up.pid))
        assert len(family) >= 5  # redis, worker, work-horse, 2 ranks, streamlit
        client.redis.close()
    finally:
        out = _stop_and_check(up, family)
    assert "worker-1 exited (code -9); restarting it" in out
    # Redis is gone with `up`; its data came back for a look at how the run ended
    from ddpviz.workers.connection import EmbeddedRedis

    with EmbeddedRedis(tmp_path / ".ddpviz" / "redis") as server:
        rec = DdpvizClient(url=server.url).get_run(run_id)
    assert rec["status"] == "canceled" and "shutting down" in rec["error"]["exception"]
