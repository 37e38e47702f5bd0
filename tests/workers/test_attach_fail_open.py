"""Fail open (issue 24, item 3): Redis unreachable from the start and an error inside the
instrumentation change nothing for the training; the events wait in the spool for `ddpviz upload`."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from attach_tools import EXAMPLES, by_rank, params, reports, run_id_of
from wtools import cli_env, ddpviz, ddpviz_argv

from ddpviz.workers.client import DdpvizClient
from ddpviz.workers.connection import free_port
from ddpviz.workers.history import read_all_events

pytestmark = pytest.mark.slow

# A user's own sitecustomize (chained before ddpviz's hook) that breaks ddpviz's step events at step 2.
SABOTAGE = """
import ddpviz.engine.attach.steps as steps
_emit = steps.StepTracker._emit_step
def _broken(self, end):
    if self.step == 2:
        raise RuntimeError("sabotaged step event")
    return _emit(self, end)
steps.StepTracker._emit_step = _broken
"""


def _one_rank_env(**extra: str) -> dict[str, str]:
    # one process that is rank 0 of 1, as torchrun would start it
    return cli_env(None, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), **extra)


def test_no_redis_and_a_broken_part_leave_training_unchanged_and_upload_stores_the_rest(
        tmp_path, redis_url, redis_client):
    script = [sys.executable, str(EXAMPLES / "train_regression.py"), "--epochs", "1", "--accum", "2"]
    plain = subprocess.run(script, env=_one_rank_env(TRAIN_REPORT=str(tmp_path / "plain.json")),
                           capture_output=True, text=True, timeout=600)
    assert plain.returncode == 0, plain.stderr[-3000:]
    user = tmp_path / "user_site"
    user.mkdir()
    (user / "sitecustomize.py").write_text(SABOTAGE)
    env = _one_rank_env(TRAIN_REPORT=str(tmp_path / "att.json"))
    env["PYTHONPATH"] = f"{user}:{env['PYTHONPATH']}"
    spool = tmp_path / "spool"
    dead = f"redis://127.0.0.1:{free_port()}/0"  # nobody listens there
    att = subprocess.run([*ddpviz_argv(), "run", "--url", dead, "--spool", str(spool), "--", *script],
                         env=env, capture_output=True, text=True, timeout=600)
    assert att.returncode == 0, att.stderr[-3000:]
    assert att.stderr.count("training goes on, events are kept in") == 1
    assert att.stderr.count("steps instrumentation off after an error (RuntimeError: sabotaged step event)") == 1
    a, b = params(tmp_path / "att.json"), params(tmp_path / "plain.json")
    assert all(torch.equal(a[n], b[n]) for n in a)  # training as without ddpviz
    up = ddpviz("upload", str(spool), "--url", redis_url, env=cli_env(redis_url))
    assert up.returncode == 0, up.stderr
    run_id = up.stdout.strip()
    client = DdpvizClient(redis=redis_client)
    events = read_all_events(client, run_id)
    assert client.get_run(run_id)["status"] == "succeeded"
    assert sorted(e["step"] for e in by_rank(events, "step")[0]) == [0, 1]  # then the part was off
    logs = [e["message"] for e in events if e["type"] == "log"]
    assert len(logs) == 1 and "sabotaged step event" in logs[0]
    assert reports(tmp_path / "att.json", nproc=1)[0]["steps"] > 2  # the script went on to its end


def test_attaching_switched_off_says_so_and_the_command_runs_unwatched(tmp_path, redis_url, redis_client):
    """`DDPVIZ_ATTACH_OFF=1 ddpviz run -- CMD`: the command runs as without ddpviz (its exit code
    passed through), one line says that nothing is instrumented, the run holds no step."""
    script = [sys.executable, "-c", "import sys; print('trained'); sys.exit(3)"]
    proc = subprocess.run([*ddpviz_argv(), "run", "--spool", str(tmp_path / "spool"), "--", *script],
                          env=cli_env(redis_url, DDPVIZ_ATTACH_OFF="1"), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3 and proc.stdout == "trained\n", proc.stderr
    assert proc.stderr.count("DDPVIZ_ATTACH_OFF=1: no process of the command is instrumented") == 1
    run_id = run_id_of(proc.stderr)
    client = DdpvizClient(redis=redis_client)
    assert client.get_run(run_id)["status"] == "failed"
    assert not [e for e in read_all_events(client, run_id) if e["type"] == "step"]
