"""Helpers for the workers tests: the ddpviz command, worker subprocesses, waiting, processes."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

# A tiny config that trains in a few seconds on 2 CPU cores.
TINY = {"model": "mlp", "dataset": "digits", "width": 16, "depth": 1, "global_batch_size": 32,
        "steps": 5, "eval_every": 0}


TEST_JOB_FUNCS = "wjobs.ignore_cancel"  # the stand-in jobs of wjobs.py


def ddpviz_argv() -> list[str]:
    """The installed console script when there is one, else ``python -m ddpviz.workers``."""
    script = Path(sys.executable).parent / "ddpviz"
    if script.exists():
        return [str(script)]
    found = shutil.which("ddpviz")
    return [found] if found else [sys.executable, "-m", "ddpviz.workers"]


def cli_env(redis_url: str | None = None, **extra: str) -> dict[str, str]:
    """Environment for a ddpviz subprocess: REDIS_URL set (or removed), tests/workers importable
    (for the test-only jobs in wjobs.py)."""
    env = dict(os.environ)
    env.pop("REDIS_URL", None)
    if redis_url:
        env["REDIS_URL"] = redis_url
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["DDPVIZ_EXTRA_JOB_FUNCS"] = TEST_JOB_FUNCS  # workers run only allowed functions
    # a process killed by a fatal signal prints every thread's Python stack: a plain reference rank
    # twice died of SIGABRT ("terminate called without an active exception") under load, cause not
    # yet seen (2026-12-04); the next one says where it was
    env["PYTHONFAULTHANDLER"] = "1"
    env.update(extra)
    return env


def ddpviz(*args: str, env: dict[str, str], timeout: float = 60, cwd: str | Path | None = None,
           ) -> subprocess.CompletedProcess:
    """Run ``ddpviz ARGS`` to completion, capturing text output."""
    return subprocess.run([*ddpviz_argv(), *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def wait_for(pred: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.1) -> Any:
    """Poll `pred` until it returns something truthy; fail the test after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


def stop_process(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM (then SIGKILL) `proc` and reap it."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            subprocess.Popen.wait(proc, grace_s)  # the plain wait, also for a WorkerPopen
        except subprocess.TimeoutExpired:
            proc.kill()
            subprocess.Popen.wait(proc, 5)


class WorkerPopen(subprocess.Popen):
    """A ``ddpviz worker`` process whose `wait` that times out fails the test with what the
    worker was doing: SIGUSR1 makes it and its work-horse write every thread's stack to the log
    (`workers.worker.STACKS_SIGNAL`), whose tail the failure shows."""

    log_path: Path

    def wait(self, timeout: float | None = None) -> int:
        try:
            return super().wait(timeout)
        except subprocess.TimeoutExpired:
            for pid in [self.pid, *descendants(self.pid)]:
                try:
                    os.kill(pid, signal.SIGUSR1)
                except ProcessLookupError:
                    pass
            time.sleep(1.0)
            raise AssertionError(f"ddpviz worker (pid {self.pid}) still running after {timeout} s; "
                                 f"its log, with every thread's stack:\n"
                                 f"{self.log_path.read_text(errors='replace')[-12000:]}") from None


@contextmanager
def worker_process(redis_url: str, *, burst: bool = True, name: str | None = None,
                   log_path: Path | None = None, env: dict[str, str] | None = None):
    """A ``ddpviz worker`` subprocess on `redis_url` (environment `env`, default `cli_env`),
    logging to `log_path` (default: a temporary file); stopped and reaped on exit."""
    import tempfile

    args = ["worker"] + (["--burst"] if burst else []) + (["--name", name] if name else [])
    with contextlib.ExitStack() as stack:
        if log_path is None:
            log_path = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ddpviz-worker-"))) / "log"
        out = stack.enter_context(open(log_path, "w"))
        proc = WorkerPopen([*ddpviz_argv(), *args], env=env or cli_env(redis_url),
                           stdout=out, stderr=subprocess.STDOUT)
        proc.log_path = log_path
        try:
            yield proc
        finally:
            stop_process(proc)


def alive(pid: int) -> bool:
    """True if `pid` runs (zombies, which an orphan becomes under some container inits, count as
    ended)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def descendants(pid: int) -> list[int]:
    import psutil

    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
