"""The ``ddpviz`` command.

    ddpviz train --mode ddp --world-size 2 --steps 50 --events run.jsonl   # here, no Redis
    ddpviz submit --pair --world-size 2 --wait                             # through Redis
    ddpviz worker | runs | cancel RUN_ID | requeue RUN_ID | export RUN_ID --out run.jsonl | up
    ddpviz doctor [--gpu] [--out DIR]                                     # check the installation

Exit codes: 0 success; 1 the run failed or was canceled (or a run id is unknown); 2 a refused
setting (the message names the field) or unreachable Redis (the message names the URL).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from datetime import datetime
from typing import Any, Callable

from ddpviz.engine.export import EXPORT_FORMATS
from ddpviz.workers.cli.exits import EXIT_FAILED, EXIT_OK, EXIT_REFUSED, no_run
from ddpviz.workers.cli.export import cmd_export

WAIT_POLL_S = 0.25  # `submit --wait` reads new events this often


def _err(message: str) -> None:
    print(f"ddpviz: {message}", file=sys.stderr, flush=True)


def _client(args: argparse.Namespace):
    from ddpviz.workers.client import cli_client

    return cli_client(args.url)


# -- train ------------------------------------------------------------------------------------

def cmd_train(args: argparse.Namespace) -> int:
    """Run one job in this process (DDP: rank processes on this host); no Redis."""
    from ddpviz.engine.config import validate_config
    from ddpviz.engine.events import CallbackSink, FanoutSink, JsonlWriter
    from ddpviz.engine.batching import BatchingSink
    from ddpviz.workers.cli.flags import run_fields
    from ddpviz.workers.cli.progress import RunProgress, summary_line
    from ddpviz.workers.store import new_run_id

    cfg = validate_config(run_fields(args))
    run_id = args.run_id or new_run_id()
    progress = RunProgress(cfg.steps, f"{cfg.mode} {run_id}")
    sinks: list[Any] = [CallbackSink(progress.on_event)]
    if args.events:
        try:
            open(args.events, "w").close()  # a fresh file per run (JsonlWriter appends)
        except OSError as exc:  # before anything trains, not a traceback after (a new user, 2026-12-06)
            progress.close()
            _err(f"refused: --events: cannot write {args.events}: {exc.strerror or exc}")
            return EXIT_REFUSED
        sinks.append(BatchingSink(JsonlWriter(args.events)))
    stop = threading.Event()

    def on_sigint(signum, frame):
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        _err("stopping the run (Ctrl-C again to abort at once)")

    previous = signal.signal(signal.SIGINT, on_sigint)
    from ddpviz.engine.run import run_training  # loads torch

    try:
        result = run_training(cfg, FanoutSink(*sinks), run_id, should_stop=stop.is_set)
    finally:
        signal.signal(signal.SIGINT, previous)
        FanoutSink(*sinks).close()
        progress.close()
    print(summary_line(run_id, result.status, result.summary, result.error, cfg.mode), flush=True)
    if result.status == "failed" and (result.error or {}).get("traceback") and args.verbose:
        print(result.error["traceback"], file=sys.stderr)
    return EXIT_OK if result.status == "succeeded" else EXIT_FAILED


# -- submit and follow ------------------------------------------------------------------------

def cmd_submit(args: argparse.Namespace) -> int:
    """Validate and enqueue a run (or a DP+DDP pair); optionally follow it to its end."""
    from ddpviz.engine.config import validate_config
    from ddpviz.workers.cli.flags import run_fields

    fields = run_fields(args)
    for mode in ("dp", "ddp") if args.pair else (None,):  # a refused setting needs no Redis
        validate_config({**fields, "mode": mode} if mode else fields)
    client = _client(args)
    if args.pair:
        run_ids = list(client.submit_pair(fields, label=args.label, timeout_s=args.timeout_s))
    else:
        run_ids = [client.submit(fields, label=args.label, timeout_s=args.timeout_s)]
    for run_id in run_ids:
        print(run_id, flush=True)
    if not args.wait:
        return EXIT_OK
    return follow(client, run_ids)


def follow(client: Any, run_ids: list[str]) -> int:
    """Show progress bars until every run has ended; print a summary line per run.

    Returns:
        0 if every run finished, else 1.
    """
    from ddpviz.workers.cli.progress import RunProgress, summary_line
    from ddpviz.workers.heartbeat import NO_WORKER
    from ddpviz.workers.store import TERMINAL

    records = {rid: client.get_run(rid) for rid in run_ids}
    bars = {rid: RunProgress(rec["config"].get("steps", 0), rec.get("label") or rid, i)
            for i, (rid, rec) in enumerate(records.items())}
    last = {rid: "0-0" for rid in run_ids}
    pending = set(run_ids)
    warned = False
    try:
        while pending:
            status = {rid: client.get_run(rid)["status"] for rid in pending}  # one read per run and poll
            if not warned and "queued" in status.values() and not client.workers():
                # said once: a queued run with no worker waits silently else
                _err(f"waiting: {NO_WORKER}; Ctrl-C stops following (the runs stay queued)")
                warned = True
            for rid in sorted(pending):
                ended = status[rid] in {s.value for s in TERMINAL}
                events, last[rid] = client.read_events(rid, last[rid])
                for event in events:
                    bars[rid].on_event(event)
                if ended and not events:  # terminal and the stream drained
                    pending.discard(rid)
            if pending:
                time.sleep(WAIT_POLL_S)
    except KeyboardInterrupt:
        _err(f"stopped following; the runs go on (ddpviz cancel {' '.join(run_ids)})")
        return EXIT_FAILED
    finally:
        for bar in bars.values():
            bar.close()
    ok = True
    for rid in run_ids:
        rec = client.get_run(rid)
        print(summary_line(rid, rec["status"], rec["summary"], rec["error"], (rec.get("config") or {}).get("mode")),
              flush=True)
        ok &= rec["status"] == "succeeded"
    return EXIT_OK if ok else EXIT_FAILED


# -- worker, runs, cancel, export, up ---------------------------------------------------------

def cmd_worker(args: argparse.Namespace) -> int:
    import os

    from ddpviz.workers.jobs.node import ADVERTISE_ENV, RDZV_PORTS_ENV
    from ddpviz.workers.worker import run_worker

    for var, value in ((ADVERTISE_ENV, args.advertise_addr), (RDZV_PORTS_ENV, args.rdzv_ports)):
        if value:  # read by this worker's multi-host node jobs (workers.jobs.node)
            os.environ[var] = value
    from ddpviz.workers.retention import KEEP_DAYS_ENV, KEEP_RUNS_ENV, RetentionError, RetentionPolicy

    for var, value in ((KEEP_RUNS_ENV, args.keep_runs), (KEEP_DAYS_ENV, args.keep_days)):
        if value is not None:  # read by the worker and its work-horses (workers.retention)
            os.environ[var] = str(value)
    try:
        RetentionPolicy.from_env()
    except RetentionError as exc:
        _err(str(exc))
        return EXIT_REFUSED

    try:
        run_worker(args.url, name=args.name, burst=args.burst)
    except ValueError as exc:  # RQ: another live worker has this name
        _err(str(exc))
        return EXIT_REFUSED
    return EXIT_OK


def _when(ts: float | None) -> str:
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


def _duration(rec: dict[str, Any]) -> str:
    if not rec["started_at"]:
        return "-"
    end = rec["finished_at"] or time.time()
    return f"{end - rec['started_at']:.1f}s"


# DEVICES, as the app's Runs table: a single run of a set keeps the set's world_size in its config but trains on
# one device (`ddpviz runs` read "single 2", a new user, 2026-12-06)
RUNS_COLUMNS = ("RUN_ID", "STATUS", "LABEL", "MODE", "DEVICES", "STEPS", "CREATED", "TIME", "WORKER")
RIGHT_ALIGNED = {"DEVICES", "STEPS", "TIME"}


def steps_cell(run: dict[str, Any]) -> str:
    """`ddpviz runs`' STEPS: the steps asked for, as "done/asked" where a run ended short of them (a pair's DP
    canceled at step 110 read 400, while an attached run, which stores the steps it did, read 4: a new user,
    2026-12-06)."""
    asked, done = (run.get("config") or {}).get("steps"), (run.get("summary") or {}).get("steps_done")
    if done is not None and asked and done != asked:
        return f"{done}/{asked}"
    return str(asked if asked is not None else "-")


def runs_table(runs: list[dict[str, Any]]) -> list[str]:
    """`ddpviz runs` lines: a header and a row per run, each column as wide as its widest cell
    (labels are shown whole, so long ones never push the other columns out of line)."""
    from ddpviz.engine.config import devices_used

    rows = []
    for r in runs:
        cfg = r["config"] or {}
        rows.append((r["run_id"], r["status"] or "-", r["label"] or "-", str(cfg.get("mode", "-")),
                     str(devices_used(cfg) or "-"), steps_cell(r), _when(r["created_at"]),
                     _duration(r), r["worker"] or "-"))
    widths = [max([len(h)] + [len(row[i]) for row in rows]) for i, h in enumerate(RUNS_COLUMNS)]

    def line(cells) -> str:
        return "  ".join(c.rjust(w) if h in RIGHT_ALIGNED else c.ljust(w)
                         for h, c, w in zip(RUNS_COLUMNS, cells, widths)).rstrip()

    return [line(RUNS_COLUMNS)] + [line(row) for row in rows]


def cmd_runs(args: argparse.Namespace) -> int:
    runs = _client(args).list_runs(args.limit)
    if args.json:
        print(json.dumps(runs, indent=2))
        return EXIT_OK
    print("\n".join(runs_table(runs)))
    return EXIT_OK


def cmd_cancel(args: argparse.Namespace) -> int:
    from ddpviz.workers.store import TERMINAL

    client = _client(args)
    before = client.get_run(args.run_id)
    if before is None:
        _err(no_run(args.run_id, args.url))
        return EXIT_FAILED
    if before["status"] in {s.value for s in TERMINAL}:
        _err(f"run {args.run_id} already ended ({before['status']}); nothing to cancel")
        print(before["status"])
        return EXIT_OK
    print(client.cancel(args.run_id))
    return EXIT_OK


def cmd_requeue(args: argparse.Namespace) -> int:
    """Submit an ended (lost, failed, canceled, finished) run again; prints the new run id."""
    client = _client(args)
    try:
        new_id = client.requeue(args.run_id)
    except KeyError:
        _err(no_run(args.run_id, args.url))
        return EXIT_FAILED
    except ValueError as exc:
        if hasattr(exc, "errors"):  # ConfigError: the stored config no longer validates
            raise
        _err(str(exc))
        return EXIT_FAILED
    print(new_id)
    return EXIT_OK


def cmd_up(args: argparse.Namespace) -> int:
    from ddpviz.workers.up import run_up

    try:
        return run_up(args.host, args.port, args.workers, args.data_dir, args.app)
    except (FileNotFoundError, RuntimeError) as exc:  # e.g. another `up` uses this data folder
        _err(str(exc))
        return EXIT_REFUSED


# -- parser -----------------------------------------------------------------------------------

def at_least_one(text: str) -> int:
    """argparse type: a whole number >= 1 (`runs --limit 0` printed a header and no run, 2026-12-06).

    Raises:
        argparse.ArgumentTypeError: not a whole number, or below 1.
    """
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1 (got {text!r})")
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 (got {n})")
    return n


def build_parser() -> argparse.ArgumentParser:
    from ddpviz.workers.cli.flags import add_run_flags

    parser = argparse.ArgumentParser(prog="ddpviz", description="Launch real DP and DDP training "
                                     "runs and watch them (https://pytorch.org/docs/stable/notes/ddp.html).")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, fn: Callable[[argparse.Namespace], int], text: str,
                redis: bool = True) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=text, description=text)
        p.set_defaults(handler=fn)
        if redis:
            p.add_argument("--url", default=None, help="Redis URL (default: $REDIS_URL, else the embedded Redis of "
                           "this user's running `ddpviz up`, else redis://127.0.0.1:6379/0)")
        return p

    p = command("train", cmd_train, "run one job here, without Redis", redis=False)
    add_run_flags(p)
    p.add_argument("--events", metavar="FILE.jsonl", help="also write every event to this file")
    p.add_argument("--run-id", help="run id carried by the events (default: a new one)")
    p.add_argument("-v", "--verbose", action="store_true", help="print the traceback of a failure")

    p = command("submit", cmd_submit, "queue a run through Redis for a worker")
    add_run_flags(p)
    p.add_argument("--label", help="a name shown in the app (with --pair: 'LABEL · DP', 'LABEL · DDP')")
    p.add_argument("--pair", action="store_true", help="submit the same config as DP and as DDP")
    p.add_argument("--wait", action="store_true",
                   help="follow the run(s) with a progress bar; exit non-zero unless finished")
    p.add_argument("--timeout-s", type=float, default=None, metavar="SECONDS",
                   help="time limit from the run's start; then its processes are stopped and it "
                        "fails (default: 6 h)")

    p = command("worker", cmd_worker, "serve the queue: run submitted jobs on this host")
    p.add_argument("--name", help="worker name, unique among live workers (default: host-pid)")
    p.add_argument("--burst", action="store_true", help="quit once the queue is empty")
    p.add_argument("--advertise-addr", default=None, metavar="ADDR",
                   help="address other hosts reach this one at, for multi-host DDP "
                        "(default: $DDPVIZ_ADVERTISE_ADDR, else 127.0.0.1)")
    p.add_argument("--rdzv-ports", default=None, metavar="LOW-HIGH",
                   help="ports this host may serve a multi-host run's rendezvous on "
                        "(default: $DDPVIZ_RDZV_PORTS, else any free port)")
    p.add_argument("--keep-runs", type=int, default=None, metavar="N",
                   help="retention: keep the newest N runs, delete older ones after each run "
                        "(default $DDPVIZ_KEEP_RUNS or 500; 0 = no limit; pinned runs are kept)")
    p.add_argument("--keep-days", type=float, default=None, metavar="D",
                   help="retention: delete runs created more than D days ago (default "
                        "$DDPVIZ_KEEP_DAYS or 0 = no limit; pinned runs are kept)")

    p = command("runs", cmd_runs, "list recent runs")
    p.add_argument("--limit", type=at_least_one, default=20, help="how many of the newest runs (>= 1; default 20)")
    p.add_argument("--json", action="store_true", help="print the records as JSON")

    p = command("cancel", cmd_cancel, "cancel a queued or running run")
    p.add_argument("run_id")

    p = command("requeue", cmd_requeue, "submit an ended run (e.g. lost) again; prints the new id")
    p.add_argument("run_id")

    p = command("export", cmd_export, "write a run's events as JSON lines (or CSV, Chrome trace)")
    p.add_argument("run_id")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--out", metavar="FILE", help="file to write (default: stdout)")
    where.add_argument("--dir", metavar="DIR", help="write DIR/<run_id><suffix>, never outside DIR")
    p.add_argument("--format", choices=sorted(EXPORT_FORMATS), default="jsonl",
                   help="jsonl: every event; csv: step events; trace: Chrome trace (Perfetto)")

    p = command("up", cmd_up, "the demo: Redis ($REDIS_URL when set, else an embedded server that this user's "
                "other ddpviz commands find from any folder), worker(s) and the app", redis=False)
    p.add_argument("--host", default="127.0.0.1", help="address the app listens on (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8501, help="the app's port (default: 8501)")
    p.add_argument("--workers", type=int, default=1, help="worker processes to start (default: 1)")
    p.add_argument("--data-dir", default=".ddpviz", help="folder for the embedded Redis' data (default: .ddpviz)")
    p.add_argument("--app", help=argparse.SUPPRESS)  # another Streamlit script (tests)

    from ddpviz.workers.cli.attach import register as register_attach
    from ddpviz.workers.cli.local import register
    from ddpviz.workers.cli.predict import register as register_predict
    from ddpviz.workers.cli.tune import register as register_tune
    from ddpviz.workers.doctor.checks import register as register_doctor

    register(command, add_run_flags)
    register_predict(command)
    register_attach(command)
    register_tune(command)
    register_doctor(command)
    return parser


def _refused(exc: Any) -> int:
    from ddpviz.workers.cli.flags import flag_name

    for field, message in exc.errors:
        hint = f" [{flag_name(field)}]" if field and field.isidentifier() else ""
        _err(f"refused: {message}{hint}")
    return EXIT_REFUSED


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``ddpviz`` console script; exits with the command's code."""
    import redis

    from ddpviz.engine.config import ConfigError
    from ddpviz.workers.connection import RedisUnavailable

    args = build_parser().parse_args(argv)
    try:
        code = args.handler(args)
    except ConfigError as exc:
        code = _refused(exc)
    except RedisUnavailable as exc:
        _err(str(exc))
        code = EXIT_REFUSED
    except redis.exceptions.ConnectionError as exc:
        _err(f"lost the connection to Redis: {exc}")
        code = EXIT_REFUSED
    except redis.exceptions.TimeoutError as exc:  # a server that accepts but does not answer (stopped, overloaded)
        _err(f"Redis did not answer in time ({exc}): is its server stopped or overloaded?")
        code = EXIT_REFUSED
    except KeyboardInterrupt:
        code = 130
    except BrokenPipeError:  # `ddpviz runs | head`: the reader left; not an error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = EXIT_OK
    sys.exit(code)
