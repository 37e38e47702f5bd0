"""How an attached run ends: a failing rank (its exception from torchrun's error file), a cancel
from the CLI (the command's process group stopped, no process left), and Redis stopped mid-run
(the script goes on and exits 0; `ddpviz upload` stores every step) (issue 24, items 1, 3)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess

import pytest
from attach_tools import by_rank, reports, run_attached, run_id_in, torchrun
from wtools import alive, cli_env, ddpviz, ddpviz_argv, descendants, wait_for

from ddpviz.workers.cli.attach import LAUNCHER_NICE
from ddpviz.workers.client import DdpvizClient
from ddpviz.workers.connection import EmbeddedRedis, connect
from ddpviz.workers.history import read_all_events

pytestmark = pytest.mark.slow

# rank 1 stops at a step: an exception (FAILING), or an exit with a code of its own and no exception (EXITS: rank 0
# then fails in its all-reduce, "Connection closed by peer")
RANK_1_STOPS = """
import sys, torch, torch.distributed as dist, torch.nn as nn
dist.init_process_group("gloo")
model = nn.parallel.DistributedDataParallel(nn.Linear(4, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(6):
    if step == {step} and dist.get_rank() == 1:
        {stop}
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
"""
FAILING = RANK_1_STOPS.format(step=3, stop='raise ValueError("bad batch at step 3")')
EXITS = RANK_1_STOPS.format(step=2, stop="sys.exit(3)")

ENDLESS = """
import time, torch, torch.distributed as dist, torch.nn as nn
dist.init_process_group("gloo")
model = nn.parallel.DistributedDataParallel(nn.Linear(4, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
while True:
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    time.sleep(0.05)
"""


@pytest.fixture
def client(redis_client):
    return DdpvizClient(redis=redis_client)


def _script(tmp_path, text: str):
    path = tmp_path / "train.py"
    path.write_text(text)
    cmd = torchrun("train_regression.py")
    cmd[-1] = str(path)
    return cmd


def test_a_failing_rank_fails_the_run_with_its_exception(tmp_path, redis_url, client):
    proc, run_id = run_attached(_script(tmp_path, FAILING), redis_url, tmp_path / "r.json", tmp_path / "spool")
    assert proc.returncode != 0
    rec = client.get_run(run_id)
    assert rec["status"] == "failed"
    err = rec["error"]
    assert err["rank"] == 1 and err["exception"] == "ValueError: bad batch at step 3"
    assert "raise ValueError" in err["traceback"] and err["exit_code"] == proc.returncode


EARLY = """
import torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    raise FileNotFoundError("data/shard-1.bin")  # before any step: no event of this rank yet
dist.barrier()
"""


def test_a_rank_failing_before_its_first_step_is_named(tmp_path, redis_url, client):
    """Reference: the script's own `dist.get_rank()` of the raising process. Before 2026-12-06 the run's error said
    the exception with rank null (only a process that had written an event gave its rank)."""
    proc, run_id = run_attached(_script(tmp_path, EARLY), redis_url, tmp_path / "r.json", tmp_path / "spool")
    assert proc.returncode != 0
    err = client.get_run(run_id)["error"]
    assert err["exception"] == "FileNotFoundError: data/shard-1.bin" and err["rank"] == 1, err


def test_a_rank_that_exits_with_its_own_code_is_the_root_cause_not_the_rank_it_left_waiting(tmp_path, redis_url,
                                                                                             client):
    """Reference: the script's own `sys.exit(3)` on rank 1. torchrun exits 1 and rank 0 raises (its peer is gone);
    before 2026-12-06 the run's error was rank 0's "Connection closed by peer", the real cause unsaid."""
    proc, run_id = run_attached(_script(tmp_path, EXITS), redis_url, tmp_path / "r.json", tmp_path / "spool")
    assert proc.returncode == 1
    err = client.get_run(run_id)["error"]
    assert err["rank"] == 1 and err["exception"].startswith("CommandFailed: rank 1 exited with code 3"), err


def test_a_script_that_does_not_exist_is_named_not_taken_for_the_scripts_own_exit(tmp_path, redis_url, client):
    """A misspelt path: Python exits 2 in each rank ("can't open file"), which read "rank 0 exited with code 2,
    without an exception ... (e.g. sys.exit, or argparse's usage error)" (a new user, 2026-12-06). Reference: the
    same torchrun command without ddpviz, for the exit code; with the script's own `sys.exit(3)` the message
    stays the rank's own exit (the test above)."""
    cmd = torchrun(tmp_path / "train_regresion.py")
    plain = subprocess.run(cmd, env=cli_env(None), capture_output=True, text=True, timeout=120)
    proc, run_id = run_attached(cmd, redis_url, tmp_path / "r.json", tmp_path / "spool")
    assert plain.returncode != 0 and proc.returncode == plain.returncode
    assert "can't open file" in proc.stderr  # the command's own output, passed through
    run = client.get_run(run_id)
    assert run["status"] == "failed"
    assert run["error"]["exception"].startswith(f"CommandFailed: no such script: {tmp_path / 'train_regresion.py'}")


def _endless(tmp_path, redis_url, client) -> tuple[subprocess.Popen, str, object]:
    """`ddpviz run -- torchrun ENDLESS` started, once rank 1 has done three steps: (launcher, run id, spool)."""
    spool = tmp_path / "spool"
    proc = subprocess.Popen([*ddpviz_argv(), "run", "--spool", str(spool), "--", *_script(tmp_path, ENDLESS)],
                            env=cli_env(redis_url), stderr=subprocess.PIPE, text=True)
    try:
        run_id = wait_for(lambda: run_id_in(proc.stderr.readline()), 60, "the run id")
        wait_for(lambda: len(by_rank(read_all_events(client, run_id), "step")[1]) >= 3, 240, "three steps")
    except BaseException:
        proc.kill()
        raise
    return proc, run_id, spool


def test_cancel_stops_the_commands_process_group_and_leaves_no_process(tmp_path, redis_url, client):
    proc, run_id, spool = _endless(tmp_path, redis_url, client)
    try:
        pids = [int(p.stem.split("pid")[1]) for p in spool.glob("events-*.jsonl")]
        # the launcher yields to the training (LAUNCHER_NICE); the ranks keep this process's priority
        own = os.getpriority(os.PRIO_PROCESS, 0)
        assert os.getpriority(os.PRIO_PROCESS, proc.pid) == min(own + LAUNCHER_NICE, 19)
        assert [os.getpriority(os.PRIO_PROCESS, p) for p in pids] == [own, own]
        assert client.cancel(run_id) == "canceled"
        assert proc.wait(timeout=60) != 0
        assert client.get_run(run_id)["status"] == "canceled"
        assert len(pids) == 2 and not any(alive(p) for p in pids)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)


def test_redis_stopped_mid_run_the_script_exits_0_and_upload_stores_every_step(tmp_path):
    server = EmbeddedRedis(tmp_path / "redis").start()
    spool, report = tmp_path / "spool", tmp_path / "r.json"
    cmd = torchrun("train_regression.py", "--epochs", "6", "--accum", "2")
    env = cli_env(server.url, TRAIN_REPORT=str(report))
    proc = subprocess.Popen([*ddpviz_argv(), "run", "--spool", str(spool), "--", *cmd], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        run_id = wait_for(lambda: run_id_in(proc.stderr.readline()), 60, "the run id")
        client = DdpvizClient(url=server.url)
        wait_for(lambda: any(e["type"] == "step" for e in client.tail_events(run_id, 20)), 240, "a stored step")
        server.stop()
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        assert err.count("training goes on, events are kept in") == 1
        assert f"ddpviz upload --url {server.url} {spool}" in err  # the run's own Redis, not the default
        server = EmbeddedRedis(server.data_dir, port=server.port).start()
        up = ddpviz("upload", str(spool), env=cli_env(None))  # no --url, no $REDIS_URL: the spool knows
        assert up.returncode == 0, up.stderr
        assert f"sent to {server.url}" in up.stderr
        client = DdpvizClient(redis=connect(server.url))
        rec = client.get_run(run_id)
        assert rec["status"] == "succeeded"
        mine = reports(report)
        steps = by_rank(read_all_events(client, run_id), "step")
        for rank in (0, 1):
            assert sorted(e["step"] for e in steps[rank]) == list(range(mine[rank]["steps"]))  # each once
    finally:
        if proc.poll() is None:
            proc.kill()
        server.stop()


def test_a_sigkilled_launcher_stops_its_command_and_its_run_is_judged_lost(tmp_path, redis_url, client):
    """`ddpviz run` killed with SIGKILL can say nothing: its command gets SIGTERM from Linux (the
    parent-death signal), torchrun stops its ranks, and the launcher's heartbeat expires, so the run
    is judged lost by the same rule as a dead worker's (workers.liveness), naming the launcher."""
    proc, run_id, _ = _endless(tmp_path, redis_url, client)
    try:
        family = descendants(proc.pid)  # torchrun's agent and its two ranks
        assert len(family) >= 3
        assert client.get_run(run_id)["worker"] == f"ddpviz-run@{socket.gethostname()}:{proc.pid}"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        wait_for(lambda: not any(alive(p) for p in family), 60, "the command's processes to end")
        rec = wait_for(lambda: (r := client.get_run(run_id))["status"] == "lost" and r, 60, "the run judged lost")
        assert rec["error"]["exception"].startswith(f"LauncherLost: `ddpviz run` ({socket.gethostname()}:{proc.pid}")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
