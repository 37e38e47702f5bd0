"""The whole app as subprocesses, for the browser test and the screenshot script.

`AppStack` starts an embedded Redis (or uses a given URL), one `ddpviz worker` and
`streamlit run app/main.py` on a free loopback port, and stops what it started, each process by
its own process group.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
APP_START_TIMEOUT_S = 60.0


class AppStack:
    """Redis + worker + Streamlit. Use as a context manager; `.url` is the app's address.

    Args:
        workdir: folder for the embedded Redis data and the processes' logs.
        redis_url: an existing server; None starts an embedded one.
        persist: the embedded server keeps an append-only file, so `stop_redis` then
            `start_redis` (an outage) loses nothing.
    """

    def __init__(self, workdir: Path, redis_url: str | None = None, persist: bool = False):
        self.workdir = Path(workdir)
        self.redis_url = redis_url
        self.persist = persist
        self._redis = None
        self._procs: list[subprocess.Popen] = []
        self.url = ""

    def __enter__(self) -> "AppStack":
        from ddpviz.workers.connection import EmbeddedRedis, free_port

        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.redis_url is None:
            self._redis = EmbeddedRedis(self.workdir / "redis", persist=self.persist).start()
            self.redis_url = self._redis.url
        env = {**os.environ, "REDIS_URL": self.redis_url, "PYTHONUNBUFFERED": "1"}
        bindir = Path(sys.executable).parent
        self._start([str(bindir / "ddpviz"), "worker", "--name", "browser-test"], env, "worker")
        port = free_port()
        self._start([sys.executable, "-m", "streamlit", "run", str(ROOT / "app" / "main.py"),
                     "--server.headless", "true", "--server.address", "127.0.0.1",
                     "--server.port", str(port), "--browser.gatherUsageStats", "false",
                     "--server.fileWatcherType", "none"], env, "streamlit")
        self.url = f"http://127.0.0.1:{port}"
        self._wait_healthy()
        return self

    def _start(self, cmd: list[str], env: dict, name: str) -> None:
        log = open(self.workdir / f"{name}.log", "wb")
        self._procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True))

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + APP_START_TIMEOUT_S
        while time.monotonic() < deadline:
            for p in self._procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{p.args[:3]} exited with {p.returncode}; "
                                       f"see logs in {self.workdir}")
            try:
                with urllib.request.urlopen(f"{self.url}/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError(f"streamlit did not answer within {APP_START_TIMEOUT_S:g} s")

    def stop_redis(self) -> None:
        """Stop the embedded server (an outage, as the app sees it)."""
        self._redis.stop()

    def start_redis(self) -> None:
        """Start the embedded server again on the same port and data folder."""
        from ddpviz.workers.connection import EmbeddedRedis

        self._redis = EmbeddedRedis(self.workdir / "redis", port=self._redis.port,
                                    persist=self.persist).start()

    def log(self, name: str) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def __exit__(self, *exc) -> None:
        for p in reversed(self._procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        if self._redis is not None:
            self._redis.stop()


def launch_browser(playwright):
    """Headless Debian Chromium with the flags a container needs."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
