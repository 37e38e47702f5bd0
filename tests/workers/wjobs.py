"""Test-only RQ jobs, imported by worker subprocesses (tests/workers is on their PYTHONPATH).

They stand in for `workers.jobs.run.execute_run` to drive endings the real engine never causes on
purpose: a run that ignores its cancel flag and leaves a process outside its process group.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from rq import get_current_job

from ddpviz import workers  # noqa: F401  (RQ key prefix)
from ddpviz.workers.host.reaper import RUN_ENV_VAR
from ddpviz.workers.store import RunStore

CHILD_PID_KEY = "ddpviz:test:child:{}"


def ignore_cancel(run_id: str) -> None:
    """Mark the run started, start a child in a new session (so killing the work-horse's process
    group misses it) carrying the run's mark, then sleep through any cancel request."""
    job = get_current_job()
    RunStore(job.connection).mark_started(run_id, job.worker_name or "test")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                             env={**os.environ, RUN_ENV_VAR: run_id}, start_new_session=True)
    job.connection.set(CHILD_PID_KEY.format(run_id), str(child.pid))
    while True:
        time.sleep(1)
