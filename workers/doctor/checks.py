"""`ddpviz doctor [--gpu] [--out DIR]`: prove this installation works, end to end, in one command.

Without ``--gpu`` (fast; runs in CI): Redis answers (``$REDIS_URL`` / ``--url`` when set; the
runs themselves always go through a private embedded Redis the doctor starts and stops, so its
worker never takes, or leaves, anyone else's jobs), a worker starts and shows its heartbeat, a
5-step DP/DDP pair goes through the queue to that worker and finishes, and each run exports as
JSONL, CSV and a Chrome trace (`ddpviz export`'s own code) that read back whole. Last, everything
the doctor started is stopped and checked gone (psutil), and its temporary folder removed.

With ``--gpu`` the CUDA paths too (workers/doctor/gpu.py); without a CUDA device it refuses
before doing anything ("no CUDA device visible", exit 1).

Writes DIR/report.json and DIR/report.md (workers/doctor/report.py), the exports under
DIR/exports/, screenshots with --gpu; exits 1 when any check failed. It changes no setting and is
safe to run again: each run starts its own server and worker on free ports and names.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from ddpviz.engine.export import EXPORT_FORMATS
from ddpviz.workers.doctor.report import CheckFailed, CheckSkipped, Interrupted, Report, run_check, run_figures  # noqa: F401
from ddpviz.workers.history import read_all_events

PAIR_CONFIG = dict(world_size=2, steps=5, step_delay_s=0.0, eval_every=0, device="cpu", global_batch_size=64)
WORKER_START_TIMEOUT_S = 60.0
RUN_TIMEOUT_S = 300.0  # a doctor run's time limit (the pair takes ~20 s on 2 CPU cores)
POLL_S = 0.25


class DoctorStack:
    """The private embedded Redis and the one worker subprocess the doctor starts and stops."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.token = uuid.uuid4().hex  # every child carries it: the final sweep finds stragglers
        self.server: Any = None
        self.worker: Any = None
        self.worker_name = f"doctor-{socket.gethostname()}-{os.getpid()}-{self.token[:6]}"
        self.url = ""
        self.runs: dict[str, str] = {}  # label -> run id of the runs the doctor submitted

    def start_redis(self) -> str:
        from ddpviz.workers.connection import EmbeddedRedis

        self.server = EmbeddedRedis(self.workdir / "redis", persist=False).start()
        self.url = self.server.url
        return self.url

    def client(self):
        from ddpviz.workers.client import DdpvizClient

        return DdpvizClient(url=self.url)

    def start_worker(self) -> float:
        """Start `ddpviz worker` and wait for its heartbeat; returns the seconds that took."""
        from ddpviz.workers.connection import ENV_VAR
        from ddpviz.workers.host.procs import UP_TOKEN_ENV, Child

        env = {**os.environ, ENV_VAR: self.url, UP_TOKEN_ENV: self.token, "PYTHONUNBUFFERED": "1"}
        t0 = time.monotonic()
        self.worker = Child("worker", [sys.executable, "-m", "ddpviz.workers", "worker", "--name", self.worker_name],
                            env, log_path=str(self.workdir / "worker.log")).start()
        client = self.client()
        while time.monotonic() - t0 < WORKER_START_TIMEOUT_S:
            if not self.worker.running():
                raise CheckFailed(f"the worker exited with code {self.worker.proc.returncode}",
                                  dict(log_tail=self.log_tail()))
            if any(w["name"] == self.worker_name for w in client.workers()):
                return time.monotonic() - t0
            time.sleep(POLL_S)
        raise CheckFailed(f"no heartbeat from the worker within {WORKER_START_TIMEOUT_S:g} s",
                          dict(log_tail=self.log_tail()))

    def log_tail(self, chars: int = 3000) -> str:
        path = self.workdir / "worker.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def wait(self, run_ids: list[str], timeout_s: float = RUN_TIMEOUT_S) -> dict[str, dict]:
        """Records of `run_ids` once all have ended (or the time is up: then they are canceled)."""
        from ddpviz.workers.store import TERMINAL

        client, ended = self.client(), {s.value for s in TERMINAL}
        deadline = time.monotonic() + timeout_s
        while True:
            recs = {rid: client.get_run(rid) for rid in run_ids}
            if all(r["status"] in ended for r in recs.values()):
                return recs
            if time.monotonic() > deadline or not self.worker.running():
                for rid, r in recs.items():
                    if r["status"] not in ended:
                        client.cancel(rid, "ddpviz doctor: time limit")
                why = "the worker died" if not self.worker.running() else f"not ended after {timeout_s:g} s"
                raise CheckFailed(why, dict(statuses={k: v["status"] for k, v in recs.items()},
                                            log_tail=self.log_tail()))
            time.sleep(POLL_S)

    def stop(self) -> None:
        """Stop the worker (warm, then cold), sweep any process carrying the token, stop Redis."""
        from ddpviz.workers.host.procs import sweep

        if self.worker is not None:
            self.worker.signal_group(signal.SIGTERM)
            self.worker.wait(15.0)
            self.worker.stop(3.0)
        sweep(self.token)
        if self.server is not None:
            self.server.stop()


def check_redis(stack: DoctorStack, url: str | None) -> tuple[str, dict[str, Any]]:
    from ddpviz.workers.connection import connect, redact

    figures: dict[str, Any] = {}
    if url:  # the configured server: reachable, and how fast
        client = connect(url)
        t0 = time.perf_counter()
        client.ping()
        figures["configured"] = dict(url=redact(url), ping_ms=(time.perf_counter() - t0) * 1e3,
                                     redis_version=client.info("server").get("redis_version"))
        client.close()
    t0 = time.perf_counter()
    stack.start_redis()
    figures["private"] = dict(url=stack.url, start_s=time.perf_counter() - t0,
                              redis_version=stack.client().redis.info("server").get("redis_version"))
    where = f"{redact(url)} answers; " if url else ""
    return f"{where}runs go through a private embedded Redis at {stack.url}", figures


def check_worker(stack: DoctorStack) -> tuple[str, dict[str, Any]]:
    startup_s = stack.start_worker()
    me = next(w for w in stack.client().workers() if w["name"] == stack.worker_name)
    kinds = sorted({d.get("kind", "?") for d in me["devices"]})
    return (f"worker {stack.worker_name} sent its heartbeat after {startup_s:.1f} s",
            dict(name=stack.worker_name, pid=me["pid"], startup_s=startup_s, device_kinds=kinds,
                 gpus=len(me["gpus"])))


def check_pair(stack: DoctorStack, config: dict[str, Any] = PAIR_CONFIG) -> tuple[str, dict[str, Any]]:
    client = stack.client()
    dp_id, ddp_id = client.submit_pair(config, timeout_s=RUN_TIMEOUT_S)
    stack.runs.update(dp=dp_id, ddp=ddp_id)
    recs = stack.wait([dp_id, ddp_id])
    figures = {label: run_figures(client, recs[rid]) for label, rid in (("dp", dp_id), ("ddp", ddp_id))}
    bad = [f"{k} {v['status']} ({v['error']})" for k, v in figures.items() if v["status"] != "succeeded"]
    if bad:
        raise CheckFailed("; ".join(bad), dict(figures, log_tail=stack.log_tail()))
    short = [k for k, v in figures.items() if v["steps_done"] != config["steps"]]
    if short:
        raise CheckFailed(f"{short} did not report {config['steps']} steps", figures)
    return f"DP and DDP ({config['world_size']} devices, {config['steps']} steps) finished", figures


def check_exports(stack: DoctorStack, out_dir: Path) -> tuple[str, dict[str, Any]]:
    """`ddpviz export` of each run in each format (the command, as a user runs it), read back and
    counted against the stream."""
    if not stack.runs:
        raise CheckSkipped("no finished runs to export (the pair check did not run)")
    client, folder, figures = stack.client(), out_dir / "exports", {}
    for label, rid in stack.runs.items():
        events = read_all_events(client, rid)
        for fmt, spec in EXPORT_FORMATS.items():
            code = subprocess.run([sys.executable, "-m", "ddpviz.workers", "export", rid, "--dir", str(folder),
                                   "--format", fmt, "--url", stack.url], capture_output=True,
                                  timeout=120).returncode
            path = folder / f"{rid}{spec.suffix}"
            if code != 0 or not path.is_file():
                raise CheckFailed(f"export of {label} as {fmt} failed (exit {code})", figures)
            figures[f"{label}.{fmt}"] = dict(path=str(path), bytes=path.stat().st_size,
                                             **_read_back(fmt, path, events))
    return f"{len(figures)} exports written under {folder} and read back whole", figures


def _read_back(fmt: str, path: Path, events: list[dict[str, Any]]) -> dict[str, Any]:
    text = path.read_text(encoding="utf-8")
    steps = sum(e["type"] == "step" for e in events)
    if fmt == "jsonl":
        lines = [json.loads(line) for line in text.splitlines()]
        if len(lines) != len(events):
            raise CheckFailed(f"{path.name}: {len(lines)} lines for {len(events)} events")
        return dict(lines=len(lines))
    if fmt == "csv":
        rows = len(text.splitlines()) - 1
        if rows != steps:
            raise CheckFailed(f"{path.name}: {rows} rows for {steps} step events")
        return dict(rows=rows)
    spans = [e for e in json.loads(text)["traceEvents"] if e.get("ph") == "X"]
    if not spans:
        raise CheckFailed(f"{path.name}: no spans")
    return dict(spans=len(spans), categories=sorted({e["cat"] for e in spans}))


def check_cleanup(stack: DoctorStack) -> tuple[str, dict[str, Any]]:
    """Everything the doctor started is gone and its temporary folder removed."""
    import psutil

    from ddpviz.workers.host.procs import UP_TOKEN_ENV
    from ddpviz.workers.host.reaper import processes_with_env

    stack.stop()
    shutil.rmtree(stack.workdir, ignore_errors=True)
    deadline = time.monotonic() + 5.0
    me = psutil.Process()
    while True:
        kids = [p for p in me.children(recursive=True) if _alive(p)]
        # multiprocessing's resource tracker and fork server (the rank processes of a run started in
        # this process fork from it: engine.modes.ranks) live as long as this process, by design.
        # Only direct children count as such: a rank forked from the server has the server's cmdline.
        trackers = [p.pid for p in me.children() if _alive(p) and any(
            name in " ".join(_cmdline(p)) for name in ("resource_tracker", "multiprocessing.forkserver"))]
        left = [dict(pid=p.pid, cmd=" ".join(_cmdline(p))[:120]) for p in kids if p.pid not in trackers]
        marked = [p.pid for p in processes_with_env(UP_TOKEN_ENV, stack.token)]
        if (not left and not marked) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    figures = dict(children_left=left, marked_left=marked, resource_trackers=trackers,
                   workdir_removed=not stack.workdir.exists())
    if left or marked or stack.workdir.exists():
        raise CheckFailed("processes or files were left behind", figures)
    return "no process left, temporary folder removed", figures


def _alive(p) -> bool:
    import psutil

    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _cmdline(p) -> list[str]:
    try:
        return p.cmdline()
    except Exception:
        return []


def run_doctor(out_dir: str | Path, *, gpu: bool = False, url: str | None = None,
               log: Callable[[str], None] = print) -> Report:
    """Run every check (CPU; with `gpu`, the CUDA ones too), write the report; returns it."""
    out = Path(out_dir)
    report = Report(gpu=gpu, autosave_dir=out)
    stack = DoctorStack(Path(tempfile.mkdtemp(prefix="ddpviz-doctor-")))
    try:
        redis_ok = report.add(run_check("redis", lambda: check_redis(stack, url), log)).verdict == "pass"
        ready = redis_ok and report.add(run_check("worker", lambda: check_worker(stack), log)).verdict == "pass"
        if ready:
            report.add(run_check("dp_ddp_pair", lambda: check_pair(stack), log))
            report.add(run_check("exports", lambda: check_exports(stack, out), log))
            if not gpu:  # with --gpu the GPU's own overhead check runs the same three sizes
                from ddpviz.workers.doctor.cost import check_bucket_cost

                report.add(run_check("bucket_cost_cpu", check_bucket_cost, log))
            if gpu:
                from ddpviz.workers.doctor.gpu import run_gpu_checks

                run_gpu_checks(stack, report, out, log)
    except Interrupted as exc:  # a stop signal (e.g. `timeout`): keep the check it cut short, then clean up
        report.add(exc.check)
        raise
    finally:
        report.add(run_check("cleanup", lambda: check_cleanup(stack), log))
        report.write(out)
    return report


def gpu_refusal() -> str | None:
    """Why `--gpu` cannot run here (no CUDA device), or None."""
    try:
        import torch
    except Exception as exc:  # torch missing or broken: say so, no traceback
        return f"no CUDA device visible (torch could not be imported: {exc})"
    if not torch.cuda.is_available():
        from ddpviz.workers.doctor.versions import describe, mismatch, read_versions

        v = read_versions(torch_mod=torch)
        why = mismatch(v)
        return (f"no CUDA device visible ({describe(v)}){'; ' + why if why else ''}; "
                f"`ddpviz doctor` without --gpu runs the CPU checks")
    return None


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)  # unwinds through run_doctor's cleanup


def cmd_doctor(args: argparse.Namespace) -> int:
    """The `ddpviz doctor` command: 0 when no check failed (each passed, warned or was skipped), else 1."""
    from ddpviz.workers.connection import ENV_VAR

    if args.gpu:
        why = gpu_refusal()
        if why:
            print(f"ddpviz doctor: {why}", file=sys.stderr, flush=True)
            return 1
    url = args.url or os.environ.get(ENV_VAR, "").strip() or None
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # e.g. `timeout`: stop what was started, then exit
    report = run_doctor(args.out, gpu=args.gpu, url=url, log=lambda m: print(m, file=sys.stderr, flush=True))
    print(f"ddpviz doctor: {report.headline()} -> {Path(args.out) / 'report.md'}", flush=True)
    return 0 if report.ok else 1


def register(command) -> None:
    """Add `doctor` to the `ddpviz` parser (`command` as in workers.cli.commands.build_parser)."""
    p = command("doctor", cmd_doctor, "check this installation end to end (Redis, a worker, a DP/DDP "
                                      "pair, exports; --gpu: the CUDA paths); writes a report")
    p.add_argument("--gpu", action="store_true",
                   help="also check the CUDA paths (needs a CUDA device; ~8 minutes on one GPU)")
    p.add_argument("--out", default="ddpviz-doctor", metavar="DIR",
                   help="folder for report.json, report.md, exports and screenshots (default: ddpviz-doctor)")
