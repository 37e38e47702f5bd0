"""`ddpviz run` is private by default and says when nothing was recorded (issue 32.2, 32.3): no
secret in the command's environment or the spool, spool folders 0700 and files 0600, the spool
removed once every event is in Redis and kept (said so) when not, `.ddpviz/` ignored by git, an
unwritable working directory falls back to a per-user temporary folder; a command in which no
process trained ends failed ``NothingInstrumented``, not an empty success. The command line is kept with its
secrets' values replaced (`workers.cli.command_env.redacted`)."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from wtools import cli_env, ddpviz_argv

from attach_tools import run_id_of
from ddpviz.workers.client import DdpvizClient
from ddpviz.workers.spool import user_temp_root

pytestmark = pytest.mark.slow

# one optimizer step (so this process writes its event file), then what it sees of the run
PROBE = """
import json, os, stat, sys, torch
m = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
m(torch.randn(4, 2)).sum().backward()
opt.step()
spool = os.environ["DDPVIZ_ATTACH_SPOOL"]
json.dump({"env": dict(os.environ), "spool": spool}, open(sys.argv[1], "w"))
"""


def _run(tmp_path: Path, url: str, cwd: str, redis_url: str | None, *args: str) -> tuple[subprocess.CompletedProcess,
                                                                                       dict]:
    script, report = tmp_path / "probe.py", tmp_path / "probe.json"
    script.write_text(PROBE)
    proc = subprocess.run([*ddpviz_argv(), "run", "--url", url, "--", sys.executable, str(script), str(report),
                           *args],
                          env=cli_env(redis_url, PYTHONPATH=""), cwd=cwd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, json.loads(report.read_text())


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_no_secret_anywhere_and_a_private_spool_kept_when_redis_refuses(tmp_path, redis_url):
    from ddpviz.workers.connection import free_port

    secret_url = f"redis://:s3cret-token@127.0.0.1:{free_port()}/0"  # no server there: events kept
    work = tmp_path / "work"
    work.mkdir()
    # the script's own secrets on its command line (before 2026-12-06 kept whole in the environment and the spool)
    proc, seen = _run(tmp_path, secret_url, str(work), None, "--api-token", "s3cret-arg", "--wandb-key=s3cret-key")
    assert "DDPVIZ_ATTACH_URL" not in seen["env"]
    assert not [k for k, v in seen["env"].items() if "s3cret" in v]  # was DDPVIZ_ATTACH_URL, then the command
    assert str(Path(__file__).resolve().parents[2]) not in seen["env"]["PYTHONPATH"].split(":")  # no repository
    spool = Path(seen["spool"])
    assert spool.parent == work / ".ddpviz" / "spool"
    assert (work / ".ddpviz" / ".gitignore").read_text() == "*\n"
    assert spool.is_dir() and f"events are kept in {spool}" in proc.stderr  # kept, and said where
    assert _mode(spool) == 0o700 and _mode(spool.parent) == 0o700 and _mode(work / ".ddpviz") == 0o700
    files = sorted(spool.iterdir())
    assert {f.name for f in files} >= {"meta.json", "ending.json"} and any(f.name.startswith("events-") for f in files)
    for f in files:
        assert _mode(f) == 0o600, f
        assert "s3cret" not in f.read_text(), f


def test_an_unwritable_cwd_falls_back_to_a_per_user_temp_folder_and_a_stored_run_leaves_no_spool(
        tmp_path, redis_url, redis_client):
    proc, seen = _run(tmp_path, redis_url, "/proc", redis_url)  # /proc: no folder can be made there
    spool = Path(seen["spool"])
    assert spool.parent == user_temp_root() / "spool"
    assert "cannot write /proc/.ddpviz" in proc.stderr and f"the run's spool is {spool}" in proc.stderr
    assert _mode(user_temp_root()) == 0o700
    assert not spool.exists()  # every event reached Redis: nothing of the run left on disk
    rec = DdpvizClient(redis=redis_client).get_run(run_id_of(proc.stderr))
    assert rec["status"] == "succeeded" and rec["summary"]["steps_done"] == 1


def test_a_command_in_which_no_process_trained_says_so(tmp_path, redis_url, redis_client):
    proc = subprocess.run([*ddpviz_argv(), "run", "--spool", str(tmp_path / "spool"), "--", sys.executable, "-c",
                           "import torch; print('prepared')"], env=cli_env(redis_url), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout == "prepared\n", proc.stderr  # the command's own exit code
    assert "no process of the command trained under the instrumentation" in proc.stderr
    rec = DdpvizClient(redis=redis_client).get_run(run_id_of(proc.stderr))
    assert rec["status"] == "failed" and rec["error"]["exception"].startswith("NothingInstrumented: ")


def test_a_command_that_replaces_pythonpath_is_told_why_nothing_was_recorded(tmp_path, redis_url, redis_client):
    # a training process whose PYTHONPATH the command set itself never loads ddpviz's start-up hook (a new user's
    # `env PYTHONPATH=lib torchrun ...`, 2026-12-06): the run says which setting did it and what to do instead
    train = ("import torch, torch.distributed as dist, torch.nn as nn\n"
             f"dist.init_process_group('gloo', init_method='file://{tmp_path}/pg', rank=0, world_size=1)\n"
             "m = nn.parallel.DistributedDataParallel(nn.Linear(4, 1))\n"
             "m(torch.randn(2, 4)).sum().backward()\nprint('trained')\n")
    proc = subprocess.run([*ddpviz_argv(), "run", "--spool", str(tmp_path / "spool"), "--", "env",
                           f"PYTHONPATH={tmp_path}", sys.executable, "-c", train], env=cli_env(redis_url),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout == "trained\n", proc.stderr
    rec = DdpvizClient(redis=redis_client).get_run(run_id_of(proc.stderr))
    assert rec["status"] == "failed" and "sets PYTHONPATH itself" in rec["error"]["exception"]
    assert "PYTHONPATH=lib:$PYTHONPATH" in proc.stderr


def test_joining_a_run_that_does_not_exist_says_so_and_a_bad_id_is_refused(tmp_path, redis_url, redis_client):
    # a new user's `--join nosuchrun` quietly made a run of that name (2026-12-06); node 0 may start later, so the
    # run is still made, with a line saying what happened
    proc = subprocess.run([*ddpviz_argv(), "run", "--join", "nosuchrun", "--spool", str(tmp_path / "spool"), "--",
                           sys.executable, "-c", "pass"], env=cli_env(redis_url), capture_output=True, text=True,
                          timeout=300)
    assert "--join nosuchrun: no such run on" in proc.stderr and "this node creates it" in proc.stderr
    bad = subprocess.run([*ddpviz_argv(), "run", "--join", "../x y", "--", sys.executable, "-c", "pass"],
                         env=cli_env(redis_url), capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "refused: --join must be a run id" in bad.stderr


def test_a_python_that_ignores_pythonpath_is_told_why_nothing_was_recorded(tmp_path, redis_url, redis_client):
    # `python -E` ignores PYTHONPATH, so ddpviz's start-up hook never loads; the run said the command had set
    # PYTHONPATH itself, which it had not (a new user, 2026-12-06): the words name -E too
    train = ("import torch, torch.distributed as dist, torch.nn as nn\n"
             f"dist.init_process_group('gloo', init_method='file://{tmp_path}/pg', rank=0, world_size=1)\n"
             "m = nn.parallel.DistributedDataParallel(nn.Linear(4, 1))\n"
             "m(torch.randn(2, 4)).sum().backward()\nprint('trained')\n")
    proc = subprocess.run([*ddpviz_argv(), "run", "--spool", str(tmp_path / "spool"), "--", sys.executable, "-E",
                           "-c", train], env=cli_env(redis_url), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout == "trained\n", proc.stderr
    rec = DdpvizClient(redis=redis_client).get_run(run_id_of(proc.stderr))
    assert rec["status"] == "failed" and "started with -E, -I or -S ignores it" in rec["error"]["exception"]
