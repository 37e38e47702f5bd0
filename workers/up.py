"""`ddpviz up`: the whole demo on one machine — Redis, N workers and the Streamlit app.

Redis is ``$REDIS_URL`` when set, else an embedded server persisted under ``<data_dir>/redis``.
Ctrl-C or SIGTERM stops everything, in order: the app; the workers (each asks its running run to
cancel, then exits; a second signal kills its work-horse; then SIGKILL); any process still
carrying this session's token; Redis last. Nothing is left behind. If `up` itself is killed
(SIGKILL, no chance to clean up), the kernel sends SIGTERM to Redis, the workers and the app it
started (Linux: `start_child`), so none of them stays behind holding the app's port.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import socket
import sys
import threading
import uuid
from pathlib import Path

from ddpviz.workers.connection import (ENV_VAR, URL_FILE, EmbeddedRedis, connect, redact, remove_up_url,
                                       write_up_url)
from ddpviz.workers.host.ports import describe_holder, port_in_use
from ddpviz.workers.host.procs import UP_TOKEN_ENV, Child, sweep

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
APP_STOP_GRACE_S = 5.0
WORKER_STOP_GRACE_S = 15.0  # a canceled run stops in about a second; DDP ranks need a bit more
POLL_S = 0.5


def default_app_path() -> Path:
    """app/main.py of the installed ``ddpviz.app`` package (found without importing it)."""
    spec = importlib.util.find_spec("ddpviz.app")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the ddpviz.app package is not installed")
    return Path(list(spec.submodule_search_locations)[0]) / "main.py"


def app_command(app: Path, host: str, port: int) -> list[str]:
    return [sys.executable, "-m", "streamlit", "run", str(app), "--server.address", host,
            "--server.port", str(port), "--server.headless", "true",
            "--browser.gatherUsageStats", "false"]


def _warn_if_exposed(host: str) -> None:
    if host not in LOOPBACK:
        print(f"ddpviz up: WARNING: the app listens on {host}; anyone who can reach it can launch "
              f"training runs on this machine. The embedded Redis stays on 127.0.0.1 and has no "
              f"password: if you set {ENV_VAR} to a server others can reach, protect it with one "
              f"(redis://:PASSWORD@host:6379/0).", file=sys.stderr)


def _stop_on_signals(stop: threading.Event) -> None:
    def handler(signum, frame):
        stop.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


WORKER_RESTARTS_MAX = 5  # restarts of dead workers per `ddpviz up`, in all


def start_child(name: str, argv: list[str], env: dict[str, str]) -> Child:
    """Start one of `up`'s children (a worker, the app): its own session, and SIGTERM from the kernel
    when `up` dies, even by SIGKILL (Linux; `workers.host.procs.parent_death_signal`). Call it from
    the main thread: the signal follows the thread that started the child."""
    return Child(name, argv, env, die_with_parent=True).start()


def _refuse_if_port_taken(host: str, port: int) -> None:
    """Raises RuntimeError naming what holds `port` (and how to stop a ddpviz app there)."""
    if port_in_use(host, port):
        holder = describe_holder(port)
        raise RuntimeError(f"port {port} is taken{': ' + holder if holder else ''}; {'or ' if holder else ''}"
                           f"try `ddpviz up --port {port + 1}`")


def run_up(host: str = "127.0.0.1", port: int = 8501, n_workers: int = 1,
           data_dir: str | os.PathLike[str] = ".ddpviz", app: str | os.PathLike[str] | None = None) -> int:
    """Run the demo until Ctrl-C / SIGTERM (or until the app exits). Returns an exit code.

    Raises:
        RedisUnavailable: ``$REDIS_URL`` is set but does not answer.
        FileNotFoundError: the app file does not exist.
    """
    app_path = Path(app) if app is not None else default_app_path()
    if not app_path.is_file():
        raise FileNotFoundError(f"app file not found: {app_path}")
    _warn_if_exposed(host)
    _refuse_if_port_taken(host, port)  # before Redis and the workers start for nothing
    stop = threading.Event()
    _stop_on_signals(stop)
    token = uuid.uuid4().hex
    server: EmbeddedRedis | None = None
    children: list[Child] = []
    url_file = Path(data_dir) / URL_FILE.name
    try:
        url = os.environ.get(ENV_VAR, "").strip()
        if not url:
            server = EmbeddedRedis(Path(data_dir) / "redis", die_with_parent=True, avoid_ports=(port,)).start()
            url = server.url
            url_file.write_text(url + "\n", encoding="utf-8")
            write_up_url(url)  # `ddpviz run` from any folder of this user finds it (connection.up_url)
        connect(url).close()  # fail early, naming the URL
        env = {**os.environ, ENV_VAR: url, UP_TOKEN_ENV: token, "PYTHONUNBUFFERED": "1"}
        hostname = socket.gethostname()
        workers = [start_child(f"worker-{i + 1}", [sys.executable, "-m", "ddpviz.workers", "worker", "--name",
                                                   f"{hostname}-up{os.getpid()}-{i + 1}"], env)
                   for i in range(n_workers)]
        children += workers
        app_child = start_child("app", app_command(app_path, host, port), env)
        children.append(app_child)
        shown = "127.0.0.1" if host == "0.0.0.0" else host
        app_url = f"http://{shown}:{port}"
        _publish_app_url(url, app_url)
        print(f"ddpviz up: Redis {redact(url)}{' (embedded)' if server else ''}, "
              f"{n_workers} worker(s); app at {app_url}  (Ctrl-C stops everything)",
              flush=True)
        return _supervise(stop, app_child, workers, server, port, children)
    finally:
        _shutdown(children, token, server, url_file)


def _publish_app_url(url: str, app_url: str) -> None:
    """Tell other commands on this Redis (`ddpviz run`) where the app is: key `keys.APP_URL`,
    refreshed by each `up` that starts; a stale one only misdirects a printed hint."""
    from ddpviz.workers import keys

    try:
        r = connect(url)
        try:
            r.set(keys.APP_URL, app_url)
        finally:
            r.close()
    except Exception as exc:  # noqa: BLE001  the demo runs without it; `ddpviz run` says "the app"
        print(f"ddpviz up: could not record the app's address in Redis ({exc})", file=sys.stderr)


def _supervise(stop: threading.Event, app_child: Child, workers: list[Child],
               server: EmbeddedRedis | None = None, port: int = 8501,
               children: list[Child] | None = None) -> int:
    """Wait for a stop request; restart workers that die, stop if the app or Redis dies.

    A dead worker is restarted (at most `WORKER_RESTARTS_MAX` times in all, so a worker that
    crashes at start does not loop); a dead app or embedded Redis ends the demo with a message,
    since nothing can work without them. Returns the exit code.
    """
    restarts = 0
    while not stop.wait(POLL_S):
        if not app_child.running():
            hint = ""
            if app_child.proc.returncode == 1:  # Streamlit's exit when it cannot bind the port, among others
                holder = describe_holder(port)
                hint = f" (port {port} is taken: {holder})" if holder else \
                    f" (is port {port} taken? try `ddpviz up --port {port + 1}`)"
            print(f"ddpviz up: the app exited (code {app_child.proc.returncode}){hint}; stopping",
                  file=sys.stderr)
            return 1
        if server is not None and server.proc is not None and server.proc.poll() is not None:
            print(f"ddpviz up: the embedded Redis exited (code {server.proc.returncode}); stopping "
                  f"— run `ddpviz up` again: finished runs are kept in its data folder", file=sys.stderr)
            return 1
        for i, w in enumerate(workers):
            if w.running():
                continue
            if restarts >= WORKER_RESTARTS_MAX:
                print(f"ddpviz up: {w.name} exited (code {w.proc.returncode}); not restarting it "
                      f"again after {restarts} restarts", file=sys.stderr)
                return 1
            restarts += 1
            print(f"ddpviz up: {w.name} exited (code {w.proc.returncode}); restarting it",
                  file=sys.stderr, flush=True)
            argv = list(w.argv)  # a fresh worker name: RQ keeps the dead one's for a while
            at = argv.index("--name") + 1
            argv[at] = re.sub(r"-restart\d+$", "", argv[at]) + f"-restart{restarts}"
            workers[i] = start_child(w.name, argv, w.env)
            if children is not None:
                children[children.index(w)] = workers[i]
    return 0


def _shutdown(children: list[Child], token: str, server: EmbeddedRedis | None,
              url_file: Path) -> None:
    # Shutdown is bounded (about APP_STOP_GRACE_S + WORKER_STOP_GRACE_S + 5 s): further Ctrl-Cs
    # must not interrupt it half-way and leave processes behind.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("ddpviz up: stopping...", file=sys.stderr, flush=True)
    for child in children:
        if child.name == "app":
            child.stop(APP_STOP_GRACE_S)
    workers = [c for c in children if c.name != "app"]
    for child in workers:  # warm shutdown of all at once: each cancels its run
        child.signal_group(signal.SIGTERM)
    for child in workers:
        child.wait(WORKER_STOP_GRACE_S)
    for child in workers:  # second signal = cold shutdown (kills the work-horse), then SIGKILL
        child.stop(3.0)
    sweep(token)
    if server is not None:
        remove_up_url()  # before the server stops: no command is sent to a Redis about to go
        server.stop()
        url_file.unlink(missing_ok=True)
