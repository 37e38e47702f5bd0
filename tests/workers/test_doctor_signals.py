"""`ddpviz doctor`'s stop signals around checks that run torch's elastic agent in its main thread.

Reference: torch's own behaviour, observed here — `elastic_launch` (a real CPU DDP run) replaces
the SIGTERM handler with torch's `_terminate_process_handler` and leaves it there, and that
handler turns a SIGTERM into `SignalException`, which ddpviz's launcher reports as a failed run.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ddpviz.workers.doctor.report import Interrupted, run_check

ROOT = Path(__file__).resolve().parents[2]
DDP_CPU = dict(mode="ddp", world_size=2, steps=2, eval_every=0, step_delay_s=0.0, global_batch_size=32, probe=False)


def _mine(signum, frame):  # a handler that is recognisably the test's
    raise AssertionError("not to be called")


@pytest.mark.slow
def test_a_check_that_runs_elastic_launch_leaves_the_handlers_as_it_found_them():
    from ddpviz.engine.config import RunConfig
    from ddpviz.engine.events import ListSink
    from ddpviz.engine.run import run_training

    before = signal.signal(signal.SIGTERM, _mine)
    try:
        inside = {}

        def ddp_run():
            result = run_training(RunConfig(**DDP_CPU), ListSink(), "signals")
            inside["handler"] = signal.getsignal(signal.SIGTERM)
            return result.status, {}

        check = run_check("ddp", ddp_run, lambda m: None)
        assert check.verdict == "pass" and check.detail == "succeeded"
        assert getattr(inside["handler"], "__name__", "") == "_terminate_process_handler"  # torch replaced it
        assert signal.getsignal(signal.SIGTERM) is _mine  # ... and the doctor put it back
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_stop_signal_a_library_swallowed_still_ends_the_doctor():
    """torch's handler turns SIGTERM into an exception the engine catches; the check must not
    go on as if nothing happened."""
    from torch.distributed.elastic.multiprocessing.api import SignalException, _terminate_process_handler

    before = signal.signal(signal.SIGTERM, _mine)
    try:
        def swallowing():
            signal.signal(signal.SIGTERM, _terminate_process_handler)  # as PContext.start does
            try:
                signal.raise_signal(signal.SIGTERM)
            except SignalException:
                pass  # as engine.modes.launcher does: the run fails, nothing is raised
            return "run failed", {}

        with pytest.raises(Interrupted) as exc:
            run_check("parity", swallowing, lambda m: None)
        assert exc.value.code == 128 + signal.SIGTERM
        assert exc.value.check.verdict == "fail" and "stopped by SIGTERM" in exc.value.check.detail
        assert signal.getsignal(signal.SIGTERM) is _mine
    finally:
        signal.signal(signal.SIGTERM, before)


SCRIPT = textwrap.dedent("""
    import argparse, sys, time
    from ddpviz.workers.doctor import checks, gpu
    from ddpviz.workers.doctor.report import run_check
    from ddpviz.engine.config import RunConfig
    from ddpviz.engine.events import ListSink
    from ddpviz.engine.run import run_training

    def fake_gpu_checks(stack, report, out, log):
        def ddp():  # as the parity check does: torch's elastic agent in this (the main) thread
            print("DDP", flush=True)
            r = run_training(RunConfig(**{cfg}), ListSink(), "sig")
            return r.status, {{}}
        report.add(run_check("ddp_in_main_thread", ddp, log))
        report.add(run_check("after", lambda: ("ran", {{}}), log))

    gpu.run_gpu_checks = fake_gpu_checks
    checks.gpu_refusal = lambda: None
    checks.check_pair = lambda stack: ("not run here", {{}})
    checks.check_exports = lambda stack, out: ("not run here", {{}})
    sys.exit(checks.cmd_doctor(argparse.Namespace(gpu=True, out=sys.argv[1], url=None)))
""")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sigterm_during_an_elastic_launch_ends_the_doctor_and_its_cleanup_runs(tmp_path):
    """`timeout` sends SIGTERM while a check's DDP ranks run under torch's elastic agent: the
    doctor stops there (the next check does not run), its cleanup check runs and passes, and no
    process it started is left."""
    import psutil

    out = tmp_path / "r"
    cfg = dict(DDP_CPU, steps=400, step_delay_s=0.05)  # ~20 s: long enough to be stopped inside
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT.format(cfg=repr(cfg)), str(out)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "DDP", proc.stderr.read()[-3000:]
        me = psutil.Process(proc.pid)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # the rank processes are up (the fork server's children)
            if len(me.children(recursive=True)) >= 5:  # redis, worker, fork server, 2 ranks
                break
            time.sleep(0.2)
        time.sleep(2.0)
        kids = me.children(recursive=True)
        os.kill(proc.pid, signal.SIGTERM)
        code = proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read()
    assert code == 128 + signal.SIGTERM, err[-3000:]
    report = {c["name"]: c for c in json.loads((out / "report.json").read_text())["checks"]}
    assert "after" not in report, "the doctor went on after the SIGTERM"
    assert report["ddp_in_main_thread"]["verdict"] == "fail"
    assert "SIGTERM" in report["ddp_in_main_thread"]["detail"]
    assert report["cleanup"]["verdict"] == "pass", report["cleanup"]
    _, alive = psutil.wait_procs(kids, timeout=15)
    assert alive == [], [p.pid for p in alive]
