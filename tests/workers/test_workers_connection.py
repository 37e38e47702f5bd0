"""Keys, URLs, connecting, and the embedded server."""

from __future__ import annotations

import os

import pytest

from ddpviz import workers  # noqa: F401  (sets RQ's key prefix)
from ddpviz.workers import keys
from ddpviz.workers.connection import (URL_FILE, EmbeddedRedis, RedisUnavailable, connect, free_port, redact, redis_url,
                                       remove_up_url, user_url_file, write_up_url)


def test_every_key_is_under_the_prefix():
    import rq.defaults

    for key in (keys.run("r1"), keys.events("r1"), keys.cancel("r1"), keys.worker("w"),
                keys.RUNS, keys.WORKERS, keys.RQ_KEY_PREFIX):
        assert key.startswith("ddpviz:"), key
    assert rq.defaults.RQ_KEY_PREFIX == "ddpviz:rq"
    assert os.environ["RQ_KEY_PREFIX"] == "ddpviz:rq"


def test_a_submitted_run_writes_only_ddpviz_keys(redis_client):
    from ddpviz.workers.client import DdpvizClient

    client = DdpvizClient(redis=redis_client)
    run_id = client.submit({"mode": "single", "world_size": 1, "steps": 3})
    client.cancel(run_id)
    names = sorted(k.decode() for k in redis_client.keys("*"))
    assert names and all(n.startswith("ddpviz:") for n in names), names
    assert f"ddpviz:rq:job:{run_id}" in names


def test_redact_hides_only_the_password():
    assert redact("redis://:s3cret@db.example:6390/2") == "redis://:***@db.example:6390/2"
    assert redact("redis://alice:s3cret@db.example/0") == "redis://alice:***@db.example/0"
    assert redact("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


def test_unreachable_redis_names_the_url_without_password():
    port = free_port()
    url = f"redis://:hunter2@127.0.0.1:{port}/0"
    with pytest.raises(RedisUnavailable) as info:
        connect(url)
    message = str(info.value)
    assert f"127.0.0.1:{port}" in message
    assert "hunter2" not in message and "***" in message


def test_malformed_url_is_unavailable_not_a_traceback():
    with pytest.raises(RedisUnavailable, match="invalid URL"):
        connect("http://nowhere")


def test_a_database_that_is_no_number_is_refused_before_connecting_and_one_out_of_range_is_no_outage(redis_url):
    """redis-py reads ``/abc`` as database 0 without a word (checked: its connection kwargs say db None), and a
    server without database 99 answered "DB index is out of range", which ddpviz said as "cannot reach"."""
    from ddpviz.workers.connection import RedisUrlInvalid

    with pytest.raises(RedisUrlInvalid, match=r"database after the port must be a whole number >= 0 \(got 'abc'\)"):
        connect("redis://:hunter2@127.0.0.1:1/abc")  # nothing listens on port 1: refused before any connect
    from urllib.parse import urlsplit, urlunsplit

    with pytest.raises(RedisUnavailable) as info:
        connect(urlunsplit(urlsplit(redis_url)._replace(path="/99")))  # the server has 16 (redis's default)
    message = str(info.value)
    assert "answered but refused" in message and "below the server's `databases`" in message, message
    assert "cannot reach" not in message
    connect(urlunsplit(urlsplit(redis_url)._replace(path="/"))).close()  # no database: 0, as redis-py reads it


def test_redis_url_prefers_env_then_up_file_then_default(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("REDIS_URL", raising=False)
    assert redis_url() == "redis://127.0.0.1:6379/0"
    URL_FILE.parent.mkdir()
    URL_FILE.write_text("redis://127.0.0.1:7777/0\n")
    assert redis_url() == "redis://127.0.0.1:7777/0"
    monkeypatch.setenv("REDIS_URL", "redis://10.0.0.1:6379/3")
    assert redis_url() == "redis://10.0.0.1:6379/3"


def test_a_running_ups_url_is_found_from_any_folder_and_a_dead_ups_is_not(monkeypatch, tmp_path):
    """`ddpviz run` from the user's own project folder finds the demo's embedded Redis (a new user's tour: it went
    to 127.0.0.1:6379 and said Redis was unreachable while `ddpviz up` ran); the folder's own file still wins."""
    import subprocess
    import sys

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.setenv("DDPVIZ_HOME", str(tmp_path / "home"))
    write_up_url("redis://127.0.0.1:7001/0")  # this process stands for the running `up`
    assert user_url_file() == tmp_path / "home" / "up.url" and user_url_file().stat().st_mode & 0o077 == 0
    assert redis_url() == "redis://127.0.0.1:7001/0"
    URL_FILE.parent.mkdir()
    URL_FILE.write_text("redis://127.0.0.1:7777/0\n")
    assert redis_url() == "redis://127.0.0.1:7777/0"  # the folder's `up` first
    URL_FILE.unlink()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    user_url_file().write_text(f"redis://127.0.0.1:7002/0 {gone.stdout.strip()}\n")  # an `up` killed by SIGKILL
    assert redis_url() == "redis://127.0.0.1:6379/0"
    remove_up_url()  # not this process's: left alone
    assert user_url_file().exists()
    write_up_url("redis://127.0.0.1:7001/0")
    remove_up_url()
    assert not user_url_file().exists()


def test_embedded_redis_listens_on_loopback_and_persists_across_restart(tmp_path):
    with EmbeddedRedis(tmp_path / "data") as server:
        assert server.url.startswith("redis://127.0.0.1:")
        client = connect(server.url)
        client.hset("ddpviz:run:x", "status", "queued")
        client.close()
        proc = server.proc
    assert proc.poll() is not None  # stopped and reaped
    assert (tmp_path / "data" / "appendonly.aof").exists()
    with EmbeddedRedis(tmp_path / "data") as server:
        assert connect(server.url).hget("ddpviz:run:x", "status") == b"queued"


def test_the_prefix_applies_outside_the_repo_too(tmp_path):
    """`ddpviz.workers` (workers/__init__.py) must run wherever ddpviz is started (a stale editable install once
    mapped `workers` as a namespace package outside the repo, and RQ used ``rq:``)."""
    import subprocess
    import sys

    code = "import ddpviz.workers, rq.defaults; print(rq.defaults.RQ_KEY_PREFIX)"
    env = {k: v for k, v in os.environ.items() if k not in ("RQ_KEY_PREFIX", "PYTHONPATH")}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.stdout.strip() == "ddpviz:rq", out.stderr


def test_two_embedded_servers_never_share_a_data_folder(tmp_path):
    with EmbeddedRedis(tmp_path) as server:
        with pytest.raises(RuntimeError, match=f"pid {server.proc.pid}"):
            EmbeddedRedis(tmp_path).start()
    with EmbeddedRedis(tmp_path):  # a stale pidfile is no obstacle
        pass


def test_up_s_embedded_redis_never_takes_the_apps_port(monkeypatch, tmp_path):
    """The kernel may hand a just-released port out again: `up`'s Redis took the port the app was about to bind,
    and the app exited with "Port 25946 is not available" (clean-clone CI, 2026-12-06). Redis skips it."""
    import ddpviz.workers.connection as connection
    import ddpviz.workers.up as up

    app_port = connection.free_port()  # nothing listens there: up's own check of it passes
    picks = iter([8611, 8611, 40123])
    monkeypatch.setattr(connection, "free_port", lambda host="127.0.0.1": next(picks))
    assert connection.EmbeddedRedis(tmp_path, avoid_ports=(8611,))._free_port() == 40123

    made = []

    class Stub:
        def __init__(self, *args, **kwargs):
            made.append(kwargs)
            raise RuntimeError("stub: no server")

    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.setattr(up, "EmbeddedRedis", Stub)
    monkeypatch.setattr(up, "_stop_on_signals", lambda stop: None)
    app = tmp_path / "app.py"
    app.write_text("")
    with pytest.raises(RuntimeError, match="stub"):
        up.run_up(port=app_port, data_dir=tmp_path / "d", app=app)
    assert made and made[0]["avoid_ports"] == (app_port,)
