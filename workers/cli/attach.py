"""``ddpviz run [--name NAME] [--url REDIS] [--bucket-timing hook|recorder] -- COMMAND...`` and ``ddpviz upload SPOOL``.

`run` watches a training command ddpviz did not write: it creates a run record (status started,
`config.attached` true), prints the run id and where to watch it, and runs COMMAND with its
output and exit code passed through unchanged. Every Python process COMMAND starts imports
`engine/attach/startup/sitecustomize.py` (first on PYTHONPATH); the training processes among
them (torchrun's workers) instrument themselves and write their events into the run's spool
folder, which this process forwards to Redis (`workers.spool`).

Status: ``succeeded`` when COMMAND exits 0; ``failed`` otherwise, with the failing rank's
exception and traceback from torchrun's error file (TORCHELASTIC_ERROR_FILE, `engine.attach.errors`);
``canceled`` when the run is canceled from the app or ``ddpviz cancel`` (COMMAND's process group
gets SIGTERM), or when `ddpviz run` itself gets SIGINT (Ctrl-C), SIGTERM or SIGHUP, which it passes
on to COMMAND's process group; either way COMMAND then has ``--kill-after`` seconds (default
`default_kill_after_s`: torchrun's own grace for its workers, plus `KILL_MARGIN_S`) to end before
SIGKILL; a second Ctrl-C kills at once; the ending says which. No process is left.
``failed`` also when COMMAND exits 0 but no process of it trained under the instrumentation (no
event file): the run says so (``NothingInstrumented``) instead of an empty success.

Fail open: Redis unreachable at start or lost mid-run changes nothing for COMMAND; one line
says so, events stay in the spool and are sent when Redis answers again, or later with
``ddpviz upload SPOOL``.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import redis

from ddpviz.engine.attach.env import PUMP_INTERVAL_S  # events are forwarded this often
from ddpviz.workers.attached import create_record, ending_of, note_unclosed, record_ending, refresh_summary
from ddpviz.workers.cli.command_env import command_env, launchers_processes, redacted
from ddpviz.workers.cli.exits import EXIT_REFUSED
from ddpviz.workers.cli.upload import _store, cmd_upload, upload_hint  # noqa: F401 (cmd_upload: `ddpviz upload`)

CANCEL_POLL_S = 0.5  # the cancel flag is read this often
RECONNECT_S = 2.0  # a lost Redis is tried again this often
# torchrun, on SIGTERM/SIGINT, passes the signal to its workers and waits `--shutdown-timeout`
# (TORCH_ELASTIC_SHUTDOWN_TIMEOUT, default 30 s: torch/distributed/launcher/api.py LaunchConfig,
# elastic/multiprocessing/api.py PContext.close) before its own SIGKILL; we wait that long and
# KILL_MARGIN_S more, so torchrun's own shutdown (and a script's checkpoint-on-SIGTERM) runs out first
TORCHRUN_GRACE_S = 30
KILL_MARGIN_S = 5.0
FINAL_SEND_S = 5.0  # at the end, how long to keep trying to store what is left (Redis was up until then)
# The launcher's scheduling priority once COMMAND has started (os.nice increment; COMMAND keeps the
# caller's): on a host whose cores the training fills, forwarding events yields to the ranks and
# runs in their gaps (waits on the all-reduce, the data loader) instead of taking a core's share
# from them (issue 24's cost rule). A separate process, so no lock the ranks need is held by it.
LAUNCHER_NICE = 10
APP_URL_UNKNOWN = "`ddpviz up` prints its address"  # no `up` recorded one on this Redis


def default_kill_after_s(env: dict[str, str] | None = None) -> float:
    """torchrun's grace (TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 30 s) + `KILL_MARGIN_S`."""
    raw = (os.environ if env is None else env).get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "")
    grace = int(raw) if raw.strip().isdigit() else TORCHRUN_GRACE_S
    return grace + KILL_MARGIN_S


def _say(message: str) -> None:
    print(f"ddpviz: {message}", file=sys.stderr, flush=True)


class Launch:
    """One `ddpviz run`: the command's process group, the forwarder, the run record."""

    def __init__(self, run_id: str, spool: Path, url: str | None, cmd: list[str], label: str | None,
                 joined: bool = False, probe: bool = False, kill_after_s: float | None = None,
                 bucket_timing: str = "auto"):
        from ddpviz.workers.spool import SpoolForwarder

        self.probe = probe  # --probe: the all-reduce probe after the script's last step
        self.bucket_timing = bucket_timing  # --bucket-timing: auto, hook (a Python comm hook) or recorder (none)
        self.joined = joined  # another launcher (node 0 of a --nnodes run) created the run and ends it
        self.run_id, self.spool, self.url, self.cmd, self.label = run_id, spool, url, cmd, label
        self.store = _store(url)
        self.forwarder = SpoolForwarder(spool, run_id, self.store)
        self.canceled: str | None = None  # why the command was signalled (then: how it ended, `ended_how`)
        self.kill_after_s = default_kill_after_s() if kill_after_s is None else kill_after_s
        self.signalled_at: float | None = None
        self.killed: str | None = None  # why SIGKILL was sent before the command ended
        self.hurry = False  # Ctrl-C during finish(): record the ending now, no more retries
        self.said_down = False
        self.proc: subprocess.Popen | None = None
        from ddpviz.workers import keys

        # the heartbeat a worker would keep, so a killed launcher's run is judged lost (workers.liveness)
        self.launcher = keys.attach_launcher(socket.gethostname(), os.getpid())
        self.next_beat = 0.0
        self.heartbeat = None  # a workers.heartbeat.Heartbeat once the record exists (node 0)

    def create(self) -> None:
        create_record(self.store, self.run_id, redacted(self.cmd), self.label, worker=self.launcher)
        self.beat()

    def beat(self) -> None:
        """Refresh this launcher's heartbeat (node 0's launcher only: it owns the record), and take
        back a run judged lost while Redis was away (`RunStore.revive`). Raises redis errors."""
        from ddpviz.workers.heartbeat import HEARTBEAT_INTERVAL_S, Heartbeat
        from ddpviz.workers.store import RunStatus

        if self.joined or self.store is None:
            return
        if self.heartbeat is None:
            self.heartbeat = Heartbeat(self.store.redis, self.launcher, lambda: (self.run_id, "attach"), devices=[],
                                       in_worker_set=False)
        self.next_beat = time.monotonic() + HEARTBEAT_INTERVAL_S
        self.heartbeat.beat()
        rec = self.store.get(self.run_id)
        if rec is not None and rec.get("status") == RunStatus.LOST.value:
            self.store.revive(self.run_id, self.launcher)

    def end_beat(self) -> None:
        from ddpviz.workers import keys

        if not self.joined and self.store is not None:
            self.store.redis.delete(keys.worker(self.launcher))

    def app_url(self) -> str:
        """Where the app is: the address `ddpviz up` recorded on this Redis (`keys.APP_URL`), else
        a hint to look at `up`'s output."""
        from ddpviz.workers import keys

        try:
            raw = self.store.redis.get(keys.APP_URL) if self.store is not None else None
        except (redis.RedisError, OSError):
            raw = None
        return raw.decode() if raw else APP_URL_UNKNOWN

    def redis_down(self, why: Any) -> None:
        if not self.said_down:
            self.said_down = True
            _say(f"events not sent to Redis ({why}); training goes on, events are kept in {self.spool} and "
                 f"sent when Redis answers (or: {upload_hint(self.spool, self.url)})")

    def signal_group(self, sig: int) -> None:
        """Signal COMMAND's process group; with SIGKILL also the group of every instrumented process
        still alive (torchrun starts each worker in a session of its own, which a signal to
        torchrun's group does not reach; torchrun passes SIGTERM and SIGINT on itself)."""
        groups = [self.proc.pid] + (launchers_processes(os.getpid()) if sig == signal.SIGKILL else [])
        for pgid in groups:
            try:
                os.killpg(pgid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def stop(self, sig: int, why: str) -> None:
        """Pass `sig` to the command; the first time, start the `kill_after_s` clock."""
        self.signal_group(sig)
        if self.signalled_at is None:
            self.canceled, self.signalled_at = why, time.monotonic()
            self.kill_at = self.signalled_at + self.kill_after_s

    def kill(self, why: str) -> None:
        self.killed = self.killed or why
        self.signal_group(signal.SIGKILL)

    def ended_how(self, exit_code: int) -> str:
        """The cancel's story: what was sent, and how the command ended."""
        waited = time.monotonic() - self.signalled_at if self.signalled_at is not None else 0.0
        if self.killed:
            return f"{self.canceled}; {self.killed}; exit code {exit_code}"
        return f"{self.canceled}; the command ended by itself {waited:.1f} s later with exit code {exit_code}"

    def check_cancel(self) -> None:
        if self.store is None or self.canceled:
            return
        try:
            reason = self.store.cancel_reason(self.run_id)
        except (redis.RedisError, OSError):
            return
        if reason:
            _say(f"run {self.run_id} canceled ({reason}); stopping the command (SIGTERM; SIGKILL after "
                 f"{self.kill_after_s:g} s)")
            self.stop(signal.SIGTERM, f"{reason}; SIGTERM sent to the command")

    def pump(self) -> None:
        """Forward new events; reconnect to a lost Redis now and then."""
        if self.store is None and time.monotonic() >= self.next_connect:
            self.next_connect = time.monotonic() + RECONNECT_S
            self.store = _store(self.url)
            if self.store is not None:
                try:
                    if not self.store.exists(self.run_id):
                        self.create()
                    self.forwarder.connect(self.store)
                    if self.said_down:
                        _say(f"Redis answers again; sending the events kept in {self.spool}")
                        self.said_down = False
                except (redis.RedisError, OSError):
                    self.store = None
        if self.store is not None and time.monotonic() >= self.next_beat:
            try:
                self.beat()
            except (redis.RedisError, OSError) as exc:
                self.redis_down(exc)
                self.store = None
                self.forwarder.connect(None)
                return
        self.forwarder.pump()
        if self.forwarder.redis_error is not None:
            self.redis_down(self.forwarder.redis_error)
            self.store = None
            self.forwarder.connect(None)

    def run(self) -> int:
        """Run the command to its end; returns its exit code (128 + N when killed by signal N)."""
        self.next_connect = time.monotonic() + RECONNECT_S
        self.kill_at: float | None = None
        env = command_env(self.run_id, self.spool, self.cmd, self.probe, self.bucket_timing)
        try:
            from ddpviz.engine.components.lifetime import die_with_parent

            # SIGTERM to the command if this launcher dies, even by SIGKILL: no training outlives it
            self.proc = subprocess.Popen(self.cmd, env=env, start_new_session=True,
                                         preexec_fn=lambda: die_with_parent(sig=signal.SIGTERM))
        except OSError as exc:
            _say(f"cannot start {self.cmd[0]!r}: {exc}")
            return 127
        try:
            os.nice(LAUNCHER_NICE)  # after the fork: COMMAND and its children run at the caller's priority
        except OSError:
            pass
        def forward(sig: int, frame: Any) -> None:  # Ctrl-C or a kill of `ddpviz run` reaches the command
            name, first = signal.Signals(sig).name, self.signalled_at is None
            if not first and sig == signal.SIGINT:
                self.kill("a second SIGINT: SIGKILL sent at once")
                return
            self.stop(sig, f"{name} sent to ddpviz run and passed on to the command")
            if first:  # said once the state is set: a second Ctrl-C from here on kills
                _say(f"{name}: passed on to the command; SIGKILL if it still runs {self.kill_after_s:g} s from now "
                     f"(--kill-after){', or at a second Ctrl-C' if sig == signal.SIGINT else ''}")

        previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        next_cancel = 0.0
        try:
            while self.proc.poll() is None:
                try:
                    self.pump()
                except Exception as exc:  # forwarding is ours; the command is the user's
                    self.redis_down(exc)
                if time.monotonic() >= next_cancel:
                    next_cancel = time.monotonic() + CANCEL_POLL_S
                    self.check_cancel()
                if self.kill_at is not None and time.monotonic() >= self.kill_at and not self.killed:
                    self.kill(f"still running {self.kill_after_s:g} s later (--kill-after): SIGKILL sent")
                time.sleep(PUMP_INTERVAL_S)
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
        self.signal_group(signal.SIGKILL)  # nothing of the command outlives it
        rc = self.proc.returncode
        return 128 - rc if rc < 0 else rc

    def record(self, ending: dict) -> None:
        """Record the ending; a joined launcher records only a failure (node 0's ends the run)."""
        if not self.joined or ending["status"] == "failed":
            record_ending(self.store, self.run_id, ending)
        else:
            refresh_summary(self.store, self.run_id)

    def ending(self, exit_code: int) -> dict[str, Any]:
        """How the run ended (`workers.attached.ending_of`), what the spool shows said on stderr."""
        return ending_of(self.spool, exit_code, self.ended_how(exit_code) if self.canceled else None, say=_say,
                         cmd=self.cmd)

    def finish(self, exit_code: int) -> bool:
        """Send what is left and record how the run ended. False when not every event was stored
        (then the spool and its `ending.json` are kept for `ddpviz upload`). A Ctrl-C meanwhile
        (`hurry`) ends the waiting: the ending is recorded at once if Redis answers; a second one
        interrupts."""
        from ddpviz.workers.spool import _write_json

        ending = self.ending(exit_code)
        try:
            note_unclosed(self.spool, self.run_id, say=_say)
        except OSError:
            pass
        _write_json(self.spool / "ending.json", ending)

        def hurry(sig: int, frame: Any) -> None:
            self.hurry = True
            signal.signal(signal.SIGINT, signal.default_int_handler)

        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, hurry) if main else None
        try:
            return self._send_rest(ending)
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)

    def _send_rest(self, ending: dict[str, Any]) -> bool:
        from ddpviz.workers.spool import remove_spool

        # A Redis lost during the run gets one more try, not FINAL_SEND_S of them: everything is in
        # the spool, and the user's command had ended (bench figure 9: 5 s of retries made a
        # 11.6 s attached run take 15.8 s with its Redis stopped mid-run).
        deadline = time.monotonic() + (0.0 if self.said_down else FINAL_SEND_S)
        while True:
            if self.store is None:
                self.next_connect = 0.0
            try:
                self.pump()
                if self.store is not None and self.forwarder.pump(final=True):
                    self.record(ending)
                    self.end_beat()
                    remove_spool(self.spool)  # every event is in Redis: nothing of the run stays on disk
                    return True
                if self.hurry and self.store is not None:  # interrupted: the run ends with what is stored
                    self.record(ending)
                    self.end_beat()
            except (redis.RedisError, OSError) as exc:
                self.redis_down(exc)
                self.store = None
            if self.hurry or time.monotonic() >= deadline:
                _say(f"{'Interrupted' if self.hurry else 'Redis unreachable'}; the run's events are kept in "
                     f"{self.spool}: send them with `{upload_hint(self.spool, self.url)}`")
                return False
            time.sleep(0.2)


def cmd_run(args: argparse.Namespace) -> int:
    from ddpviz.workers.connection import redact, redis_url
    from ddpviz.workers.store import new_run_id

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        _say("refused: give the command to run after `--` (e.g. ddpviz run -- torchrun --nproc-per-node 2 train.py)")
        return EXIT_REFUSED
    if args.kill_after is not None and not args.kill_after >= 0:
        _say(f"refused: --kill-after must be >= 0 seconds, got {args.kill_after}")
        return EXIT_REFUSED
    from ddpviz.engine.export import SAFE_ID

    if args.join is not None and not SAFE_ID.match(args.join):
        _say(f"refused: --join must be a run id (1-64 letters, digits, '-' or '_'), got {args.join[:80]!r}")
        return EXIT_REFUSED
    run_id = args.join or new_run_id()
    url = args.url or redis_url()
    default = run_id if not args.join else f"{run_id}-{socket.gethostname()}-{os.getpid()}"
    from ddpviz.workers.spool import _write_json, make_spool

    try:
        spool = make_spool(args.spool, default, _say)
    except OSError as exc:
        _say(f"refused: no folder for the run's events could be made ({exc}); give one with --spool DIR")
        return EXIT_REFUSED

    # the run's Redis, for `ddpviz upload` (left out when it holds a password: no secret in the spool)
    _write_json(spool / "meta.json", dict(run_id=run_id, command=redacted(cmd), label=args.name, joined=bool(args.join),
                                          host=socket.gethostname(), created_at=time.time(),
                                          redis_url=url if redact(url) == url else None))
    launch = Launch(run_id, spool, url, cmd, args.name, joined=bool(args.join), probe=args.probe,
                    kill_after_s=args.kill_after, bucket_timing=args.bucket_timing)
    if launch.store is not None:
        try:
            if not launch.store.exists(run_id):
                if args.join:  # node 0 may start later, so it is made here; a mistyped id makes a run of its own
                    _say(f"--join {run_id}: no such run on {redact(url)} yet, so this node creates it; if node 0's "
                         "`ddpviz run` printed another id, stop this one and join that")
                launch.create()
        except (redis.RedisError, OSError) as exc:
            launch.store = None
            launch.forwarder.connect(None)
            launch.redis_down(exc)
    else:
        launch.redis_down(f"cannot reach {redact(url)}")
    _say(f"run {run_id}: watch it in the app ({launch.app_url()}, Live) or `ddpviz runs`; spool {spool}")
    from ddpviz.engine.attach.env import OFF_ENV

    if os.environ.get(OFF_ENV) == "1":
        _say(f"{OFF_ENV}=1: no process of the command is instrumented; the run records only its command "
             f"and how it ended")
    code = launch.run()
    launch.finish(code)
    return code


def register(command) -> None:
    """Add `run` and `upload` to the ddpviz parser (`command` as in `workers.cli.commands`)."""
    p = command("run", cmd_run, "run a training command (e.g. torchrun ... train.py) and watch it live")
    p.add_argument("--name", default=None, help="the run's label in the app")
    p.add_argument("--spool", default=None, metavar="DIR",
                   help="folder for the run's events (default .ddpviz/spool/RUN_ID)")
    p.add_argument("--join", default=None, metavar="RUN_ID",
                   help="add this node's ranks to a run another `ddpviz run` started (torchrun --nnodes)")
    p.add_argument("--probe", action="store_true",
                   help="after the script's last step, time all-reduces of the run's bucket sizes on its own "
                        "process group (the all-reduce probe, for Theory); every rank must reach the end")
    from ddpviz.engine.config import BUCKET_TIMING_CHOICES

    p.add_argument("--bucket-timing", choices=BUCKET_TIMING_CHOICES, default="auto",
                   help="auto (default): recorder for a gloo DDP, hook for an NCCL one; hook: a Python comm hook "
                        "times every bucket of every step; recorder: no hook, DDP's own C++ all-reduce, bucket "
                        "bytes every step, times on sampled steps (docs/bucket-timing.md)")
    p.add_argument("--kill-after", type=float, default=None, metavar="SECONDS",
                   help="after passing SIGINT/SIGTERM (or a cancel) on to the command, SIGKILL it if still running "
                        "this long after (default: torchrun's own grace, TORCH_ELASTIC_SHUTDOWN_TIMEOUT or 30 s, "
                        f"+ {KILL_MARGIN_S:g} s); a second Ctrl-C kills at once")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the command to run")
    p = command("upload", cmd_upload, "send an attached run's spooled events to Redis", redis=False)
    p.add_argument("--url", default=None, help="Redis URL (default: $REDIS_URL; else the first that answers of the "
                   "run's own, kept in the spool when it had no password, and the embedded Redis of this user's "
                   "running `ddpviz up`, else redis://127.0.0.1:6379/0)")
    p.add_argument("spool", metavar="SPOOL")
