"""An attached run's record in Redis (`ddpviz run`, `ddpviz upload`): created started, ended with
its status, error and a summary built from its stream; and what the run's spool folder says of the
ended command: its failure read from torchrun's error file (torch.distributed.elastic writes the
failing rank's exception and traceback to TORCHELASTIC_ERROR_FILE, `error.json` in the spool), whether
anything trained under the instrumentation (`ending_of`), and ranks that left their record open
(`note_unclosed`).
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any, Callable

# a command that sets PYTHONPATH itself replaces the folder ddpviz put first on it (engine.attach.env.STARTUP_DIR): no
# process of it loads the start-up hook (a new user's `env PYTHONPATH=lib torchrun ...` and a launch script's
# `export PYTHONPATH=...`, 2026-12-06)
# ddpviz reaches the command's Python processes through PYTHONPATH alone: each way that is lost (a new user's
# `python -E` read "sets PYTHONPATH itself", which it did not, 2026-12-06)
PYTHONPATH_REPLACED = ("ddpviz reaches the command's Python processes through PYTHONPATH, its start-up folder first. "
                       "A command that sets PYTHONPATH itself (`env PYTHONPATH=...`, a launch script's "
                       "`export PYTHONPATH=...`) replaces that folder: append instead (`PYTHONPATH=lib:$PYTHONPATH`) "
                       "or set it before `ddpviz`. A Python started with -E, -I or -S ignores it, and a Python of "
                       "another installation may lack ddpviz (`python -c 'import ddpviz'` says)")
NOTHING_INSTRUMENTED = ("no process of the command trained under the instrumentation (none became a rank: "
                        "torchrun's workers, the launcher's own child, or a process that initialised a "
                        "process group); nothing was recorded. A single training process started by another "
                        "launcher (e.g. `accelerate launch --cpu`) is recorded when it calls ddpviz.watch(model). "
                        + PYTHONPATH_REPLACED)


# a failed command whose ranks left no error file (an argparse error, a crash before training): the
# terminal that ran `ddpviz run` has the command's own output, which ddpviz passes through and never reads
NO_ERROR_FILE = ("Why is in its own output, in the terminal that ran `ddpviz run`: no rank left torchrun an error "
                 "file (a rank whose main is decorated with torch.distributed.elastic.multiprocessing.errors.record "
                 "leaves its exception and traceback here).")


def is_torchrun(cmd: list[str]) -> bool:
    """Whether `cmd` is torchrun (`torchrun`, `python -m torch.distributed.run` or `.launch`), whose
    workers are the ranks; any other command's own child is the training process itself."""
    return bool(cmd) and (os.path.basename(cmd[0]) == "torchrun" or "torch.distributed.run" in cmd
                          or "torch.distributed.launch" in cmd)


NO_OUTPUT_HERE = ("Why is in its own output, in the terminal that ran `ddpviz run` (e.g. sys.exit, or argparse's "
                  "usage error).")


def first_rank_error(spool: Path) -> dict[str, Any] | None:
    """The earliest rank exception in the spool (`engine.attach.errors.RANK_ERROR_FILE`, by `time_ns`): the
    root cause where torchrun's copy names another rank that failed in the same second (its tie rule)."""
    from ddpviz.workers.spool import read_json

    docs = [d for d in (read_json(p) for p in spool.glob("error-rank*.json")) if isinstance(d, dict)]
    timed = [(d["message"]["extraInfo"]["time_ns"], d) for d in docs
             if isinstance((d.get("message") or {}).get("extraInfo", {}).get("time_ns"), int)]
    return min(timed, key=lambda t: t[0])[1] if timed else None


def missing_script(cmd: list[str] | None, cwd: Path | None = None) -> str | None:
    """The command's script (its first ``*.py`` argument) when it names no file (relative to `cwd`, default the
    current folder), else None: Python exits 2 on it ("can't open file"), which otherwise reads like a script's
    own sys.exit (a new user's misspelt path, 2026-12-06)."""
    here = Path.cwd() if cwd is None else cwd
    script = next((a for a in cmd or [] if a.endswith(".py") and not a.startswith("-")), None)  # what Python runs
    return script if script is not None and not (here / script).is_file() else None


def failure(spool: Path, exit_code: int, cmd: list[str] | None = None) -> dict[str, Any]:
    """The run's error: the first failing rank's exception and traceback (`first_rank_error`, else torchrun's
    error file), else the rank that exited first with a code of its own (`first_rank_exit`), else the
    command's exit code; where no rank raised and `cmd` names a ``.py`` file that does not exist
    (`missing_script`), the error says so first."""
    from ddpviz.workers.spool import read_json
    from ddpviz.workers.store import make_error

    doc = first_rank_error(spool) or read_json(spool / "error.json") or {}
    msg = doc.get("message")
    exited = first_rank_exit(spool)
    first_error_ns = ((msg.get("extraInfo") or {}).get("time_ns") if isinstance(msg, dict) else None)
    if exited is not None and isinstance(exited[2], int) and isinstance(first_error_ns, int) \
            and exited[2] < first_error_ns:  # a rank exited on its own before any rank raised (e.g. because of it)
        msg = None
    if isinstance(msg, dict):
        extra = msg.get("extraInfo") or {}
        err = make_error(msg.get("message") or f"exit code {exit_code}", extra.get("py_callstack"),
                         rank=extra.get("rank"), stage="training")
    elif isinstance(msg, str):
        err = make_error(msg, None, stage="training")
    elif (missing := missing_script(cmd)) and (exited is None or exited[1] == 2):  # Python's exit on a file
        err = make_error(f"CommandFailed: no such script: {missing} (from {Path.cwd()}); "
                         f"Python could not open it, so the command exited {exit_code} before anything trained.",
                         None, rank=exited[0] if exited else None, stage="training")
    elif exited is not None:
        rank, code, _ = exited
        err = make_error(f"CommandFailed: rank {rank} exited with code {code}, without an exception, before any "
                         f"rank raised one (torchrun then exits {exit_code} whatever the code). {NO_OUTPUT_HERE}",
                         None, rank=rank, stage="training")
    else:
        # torchrun's error file is torchrun's to speak of: `ddpviz run -- python train.py` has none (a new user)
        why = NO_ERROR_FILE if cmd is None or is_torchrun(cmd) else NO_OUTPUT_HERE
        err = make_error(f"CommandFailed: the command exited with code {exit_code}. {why}", None, stage="training")
    err["exit_code"] = exit_code
    return err


def first_rank_exit(spool: Path) -> tuple[int, int, int | None] | None:
    """(rank, exit code, when its Python exited: unix ns or None) of the rank that failed first by its own exit,
    from the failed ranks' exit codes torchrun's ChildFailedError held (`engine.attach.errors.RANK_EXITS_FILE`): a
    positive code (the rank's own exit: sys.exit, argparse) before a negative one (a signal: torchrun stopping the
    others), then the earliest, then the lowest rank; the time from the rank's own atexit
    (`RANK_EXIT_TIME_FILE`). None without that file."""
    from ddpviz.engine.attach.errors import RANK_EXIT_TIME_FILE, RANK_EXITS_FILE
    from ddpviz.workers.spool import read_json

    doc = read_json(spool / RANK_EXITS_FILE)
    failures = (doc or {}).get("failures") if isinstance(doc, dict) else None
    rows = []
    for rank, f in (failures or {}).items():
        code = (f or {}).get("exitcode")
        if isinstance(code, int) and code != 0 and str(rank).lstrip("-").isdigit():
            rows.append((code < 0, (f or {}).get("timestamp") or 0, int(rank), code))
    if not rows:
        return None
    _, _, rank, code = min(rows)
    when = (read_json(spool / RANK_EXIT_TIME_FILE.format(rank=rank)) or {}).get("time_ns")
    return rank, code, when if isinstance(when, int) else None


def ending_of(spool: Path, exit_code: int, canceled: str | None, say: Callable[[str], None],
              cmd: list[str] | None = None) -> dict[str, Any]:
    """How the command's run ended: ``{status, error, exit_code, ended_at}``. `canceled`: the cancel's story
    (then status canceled); else exit 0 is succeeded, unless no process wrote an event file (failed,
    ``NothingInstrumented``, said with `say`); any other exit is failed with `failure`'s error (`cmd`: the
    command, whose missing script it names)."""
    from ddpviz.engine.attach.env import OFF_ENV

    nothing = not any(spool.glob("events-*.jsonl")) and os.environ.get(OFF_ENV) != "1"
    if canceled:
        ending = dict(status="canceled", error={"rank": None, "exception": f"Canceled: {canceled}",
                                                "traceback": None}, exit_code=exit_code)
    elif exit_code == 0 and nothing:
        say(NOTHING_INSTRUMENTED)
        ending = dict(status="failed", error={"rank": None, "exception": f"NothingInstrumented: {NOTHING_INSTRUMENTED}",
                                              "traceback": None, "exit_code": 0}, exit_code=0)
    elif exit_code == 0:
        ending = dict(status="succeeded", error=None, exit_code=0)
    else:
        ending = dict(status="failed", error=failure(spool, exit_code, cmd), exit_code=exit_code)
    ending["ended_at"] = time.time()  # when the command ended: an upload records this, not its own time
    return ending


def note_unclosed(spool: Path, run_id: str, say: Callable[[str], None]) -> list[str]:
    """Ranks that ended without closing their record (their open marker is still in `spool`,
    `engine.attach.session.OPEN_MARKER`: `os._exit`, a kill): each said with `say` and written to the spool
    as a `log` warning of the run (sent with its events), so a record missing its last events (up to a
    flush interval) is not taken as whole. Returns the messages; the markers are removed.

    Raises:
        OSError: the spool cannot be written.
    """
    from ddpviz.engine.attach.env import PUMP_INTERVAL_S
    from ddpviz.engine.events import make_event

    said, lines = [], []
    for marker in sorted(spool.glob("open-rank*-pid*")):
        m = re.fullmatch(r"open-rank(\d+)-pid(\d+)", marker.name)
        if m is None:
            continue
        message = (f"rank {m.group(1)} (pid {m.group(2)}) ended without closing its record (os._exit, or a "
                   f"kill): the events of its last {PUMP_INTERVAL_S:g} s or so may be missing")
        say(message)
        said.append(message)
        lines.append(json.dumps(make_event("log", run_id, level="warning", message=message, rank=int(m.group(1)))))
        marker.unlink(missing_ok=True)
    if lines:
        with open(spool / "events-launcher.jsonl", "a") as fh:
            fh.write("\n".join(lines) + "\n")
    return said


def create_record(store: Any, run_id: str, cmd: list[str] | None, label: str | None,
                  worker: str | None = None, ran_at: float | None = None) -> None:
    """A started run record for an attached run, config ``{attached, command}`` until rank 0's
    `run_started` brings the rest, its mode among them (no mode until then: a command in which nothing
    trained, or that never started, was listed "ddp" before 2026-12-06). `worker`: the launcher's heartbeat name
    (`keys.attach_launcher`), by which a killed launcher's run is judged lost; None (`ddpviz
    upload` of a spool) leaves nothing to judge by. `ran_at` (unix s): when the run started, for
    a run stored after it ran (`ddpviz upload`: the spool's `meta.json` `created_at`); its record's
    created and started times are then that moment, not the upload's (issue 33)."""
    from ddpviz.workers import keys
    from ddpviz.workers.store import RunStatus

    store.create(run_id, {"attached": True, "command": cmd}, label=label)
    when = time.time() if ran_at is None else float(ran_at)
    store.transition(run_id, RunStatus.STARTED, allowed_from=[RunStatus.QUEUED],
                     fields={"started_at": repr(when), **({"worker": worker} if worker else {})},
                     also=lambda pipe: pipe.sadd(keys.STARTED, run_id))
    if ran_at is not None:  # the history lists runs by when they were made: when this one ran
        store.redis.hset(keys.run(run_id), "created_at", repr(when))
        store.redis.zadd(keys.RUNS, {run_id: when})


def stream_summary(store: Any, run_id: str) -> dict[str, Any]:
    """The run's summary from every event in its stream (every node's, for `--join`ed launchers)."""
    from ddpviz.engine.summary import SummaryBuilder
    from ddpviz.workers.client import DdpvizClient
    from ddpviz.workers.history import read_all_events

    builder = SummaryBuilder()
    for event in read_all_events(DdpvizClient(redis=store.redis), run_id):
        builder.observe(event)
    return builder.summary()


def _store_steps(store: Any, run_id: str, rec: dict[str, Any]) -> dict[str, Any]:
    """The run's summary from its stream; its step count written into the record's config."""
    from ddpviz.workers import keys

    summary = stream_summary(store, run_id)
    config = {**(rec.get("config") or {}), "steps": summary.get("steps_done")}
    store.redis.hset(keys.run(run_id), "config", json.dumps(config))
    return summary


def refresh_summary(store: Any, run_id: str) -> None:
    """Rebuild an ended run's summary from its stream (a joined node's last events came after
    node 0 recorded the ending)."""
    from ddpviz.workers import keys
    from ddpviz.workers.store import TERMINAL

    rec = store.get(run_id) or {}
    if rec.get("status") in {s.value for s in TERMINAL}:
        summary = _store_steps(store, run_id, rec)
        store.redis.hset(keys.run(run_id), "summary", json.dumps(summary))


def record_ending(store: Any, run_id: str, ending: dict) -> bool:
    """Set the run's terminal status, error and summary (from its stream, with a `run_finished`
    event), and its config's step count; its end time is the ending's `ended_at` (unix s, when the
    command ended) where it has one. True if this call ended it."""
    from ddpviz.workers import keys
    from ddpviz.workers.store import RunStatus

    summary = _store_steps(store, run_id, store.get(run_id) or {})
    done = store.finish(run_id, RunStatus(ending["status"]), error=ending["error"], summary=summary,
                        append_event=True, allowed_from=[RunStatus.STARTED, RunStatus.QUEUED])
    if done and ending.get("ended_at"):  # when the command ended (`ddpviz run`'s clock), not now
        store.redis.hset(keys.run(run_id), "finished_at", repr(float(ending["ended_at"])))
    return done


def store_spool(store: Any, spool: Path, run_id: str, cmd: list[str] | None, label: str | None,
                ran_at: float | None = None, ending: dict | None = None, joined: bool = False) -> None:
    """Store the events of `spool` not yet stored as run `run_id` (its record created first when
    missing, `create_record`), then its ending when given (`record_ending`; a `joined` node's
    launcher records only a failure, node 0's ends the run). What was sent is kept in the spool's
    `sent.json` (`workers.spool.SpoolForwarder`), so a second call sends only the rest.

    Raises:
        redis.RedisError, OSError: Redis stopped answering; the ending is then not recorded.
    """
    from ddpviz.workers.spool import SpoolForwarder

    if not store.exists(run_id):
        create_record(store, run_id, cmd, label, ran_at=ran_at)
    fwd = SpoolForwarder(spool, run_id, store)
    if not fwd.pump(final=True):
        raise fwd.redis_error or OSError(f"{spool}: not every event could be stored")
    if ending and (not joined or ending["status"] == "failed"):
        record_ending(store, run_id, ending)
    elif ending:
        refresh_summary(store, run_id)
