"""`ddpviz run` and signals, as torchrun handles them (issue 32.4): SIGINT/SIGTERM is passed on to
the command, which gets `--kill-after` seconds (default: torchrun's own 30 s grace + 5 s) to end
by itself (a script's checkpoint-on-signal runs to its end); a second Ctrl-C kills at once; the run
ends "canceled" saying how."""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from wtools import cli_env, ddpviz_argv

from attach_tools import run_id_in
from ddpviz.workers.client import DdpvizClient

pytestmark = pytest.mark.slow

# Traps SIGINT: with argv[2] == "checkpoint", sleeps CHECKPOINT_S (longer than the 5 s ddpviz run
# used to wait before SIGKILL), writes argv[1] and exits 0; with "ignore", goes on as if nothing came.
SCRIPT = """
import signal, sys, time
def on_int(sig, frame):
    if sys.argv[2] == "checkpoint":
        time.sleep(7)
        open(sys.argv[1], "w").write("saved")
        sys.exit(0)
signal.signal(signal.SIGINT, on_int)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


class Lines:
    """A process's stderr and stdout lines, read by threads into one queue."""

    def __init__(self, proc: subprocess.Popen):
        self.q: queue.Queue[str] = queue.Queue()
        for stream in (proc.stdout, proc.stderr):
            threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream) -> None:
        for line in stream:
            self.q.put(line)

    def wait_for(self, text: str, timeout_s: float = 120) -> str:
        while True:
            line = self.q.get(timeout=timeout_s)
            if text in line:
                return line


def _start(tmp_path: Path, redis_url: str, mode: str, *extra: str) -> tuple[subprocess.Popen, Lines, str, Path]:
    script, saved = tmp_path / "sig.py", tmp_path / "saved"
    script.write_text(SCRIPT)
    proc = subprocess.Popen([*ddpviz_argv(), "run", "--spool", str(tmp_path / "spool"), *extra, "--", sys.executable,
                             str(script), str(saved), mode], env=cli_env(redis_url), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines = Lines(proc)
    run_id = run_id_in(lines.wait_for("ddpviz: run "))
    lines.wait_for("ready")
    return proc, lines, run_id, saved


def test_a_signalled_command_gets_torchruns_grace_and_its_checkpoint_is_written(tmp_path, redis_url, redis_client):
    proc, lines, run_id, saved = _start(tmp_path, redis_url, "checkpoint")
    try:
        proc.send_signal(signal.SIGINT)
        assert "SIGKILL if it still runs 35 s from now" in lines.wait_for("passed on to the command")
        assert proc.wait(timeout=120) == 0  # the script's own exit code
    finally:
        proc.kill()
    assert saved.read_text() == "saved"  # its 7 s checkpoint was not cut off (SIGKILL came after 5 s before)
    rec = DdpvizClient(redis=redis_client).get_run(run_id)
    assert rec["status"] == "canceled"
    assert "SIGINT sent to ddpviz run and passed on to the command" in rec["error"]["exception"]
    assert "the command ended by itself" in rec["error"]["exception"]


def test_a_second_ctrl_c_kills_at_once(tmp_path, redis_url, redis_client):
    proc, lines, run_id, saved = _start(tmp_path, redis_url, "ignore", "--kill-after", "3600")
    try:
        proc.send_signal(signal.SIGINT)
        lines.wait_for("passed on to the command")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 128 + signal.SIGKILL  # not 3600 s later
    finally:
        proc.kill()
    assert not saved.exists()
    rec = DdpvizClient(redis=redis_client).get_run(run_id)
    assert rec["status"] == "canceled" and "a second SIGINT: SIGKILL sent at once" in rec["error"]["exception"]


def test_kill_after_must_be_a_duration(tmp_path, redis_url):
    proc = subprocess.run([*ddpviz_argv(), "run", "--kill-after", "-1", "--", "true"], env=cli_env(redis_url),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "--kill-after must be >= 0 seconds, got -1" in proc.stderr


def test_a_ctrl_c_while_finishing_still_ends_the_run(tmp_path, redis_url, redis_client, capsys):
    """The command has ended, `finish` is sending what is left (Redis slow: nothing stored yet) and
    Ctrl-C comes: the ending is recorded at once with what was stored (it was left 'started'),
    the spool kept for `ddpviz upload`."""
    import os

    from ddpviz.workers.cli.attach import Launch
    from ddpviz.workers.store import new_run_id

    before = signal.getsignal(signal.SIGINT)  # pytest's, or a handler an earlier test in this worker left
    run_id, spool = new_run_id(), tmp_path / "spool"
    spool.mkdir()
    (spool / "events-rank0-pid1.jsonl").write_text("")
    launch = Launch(run_id, spool, redis_url, ["python", "train.py"], None)
    launch.create()

    calls = []

    def slow_pump(final: bool = False, now: float | None = None) -> bool:
        if not calls:
            os.kill(os.getpid(), signal.SIGINT)  # one Ctrl-C while the last events are on their way
        calls.append(final)
        return False

    launch.forwarder.pump = slow_pump
    assert launch.finish(0) is False
    assert DdpvizClient(redis=redis_client).get_run(run_id)["status"] == "succeeded"
    assert "Interrupted; the run's events are kept in" in capsys.readouterr().err
    assert (spool / "ending.json").exists()
    assert signal.getsignal(signal.SIGINT) is before  # the handler finish() found, restored
