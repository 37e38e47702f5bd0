"""`ddpviz doctor`: the CPU checks end to end, the refusal of --gpu without CUDA, and the report.

The end-to-end test runs the real command in a subprocess (so its cleanup check sees only its own
children) against the session's embedded Redis as the configured server; its runs go through the
doctor's own private embedded Redis and worker.
"""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from ddpviz.workers.doctor.report import Check, CheckFailed, CheckSkipped, Report, run_check

DDPVIZ = [sys.executable, "-m", "ddpviz.workers"]


@pytest.mark.slow
def test_doctor_cpu_checks_pass_end_to_end(redis_url, tmp_path):
    out = tmp_path / "report"
    proc = subprocess.run([*DDPVIZ, "doctor", "--out", str(out), "--url", redis_url],
                          capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    report = json.loads((out / "report.json").read_text())
    checks = {c["name"]: c for c in report["checks"]}
    assert list(checks) == ["redis", "worker", "dp_ddp_pair", "exports", "bucket_cost_cpu", "cleanup"]
    cost = checks["bucket_cost_cpu"]["figures"]  # 0.1, 1 and 25 MB: PyTorch's own bucket counts, same weights
    assert [r["bucket_cap_mb"] for r in cost["rows"]] == [25.0, 1.0, 0.1]
    assert [r["buckets"] for r in cost["rows"]] == [2, 5, 20] and all(r["max_param_diff"] <= 1e-4 for r in cost["rows"])
    # the CPU bucket cost's 30 µs target is reported, not enforced: a miss here is a warning (exit code 0)
    assert checks["bucket_cost_cpu"]["verdict"] == ("pass" if cost["target_met"] else "warn")
    assert all(c["verdict"] == "pass" for n, c in checks.items() if n != "bucket_cost_cpu") and report["ok"] is True
    assert checks["redis"]["figures"]["configured"]["redis_version"]  # the --url server answered
    pair = checks["dp_ddp_pair"]["figures"]
    assert pair["dp"]["events"]["step"] == 5 and pair["ddp"]["events"]["step"] == 10  # 5 steps x 2 ranks
    assert pair["dp"]["events"]["dp_phase"] > 0 and pair["ddp"]["events"]["bucket"] > 0
    exports = checks["exports"]["figures"]
    assert exports["dp.csv"]["rows"] == 5 and exports["ddp.csv"]["rows"] == 10
    assert exports["dp.jsonl"]["lines"] == sum(pair["dp"]["events"].values())
    assert "dp_phase" in exports["dp.trace"]["categories"] and "bucket" in exports["ddp.trace"]["categories"]
    assert len(list((out / "exports").iterdir())) == 6
    assert checks["cleanup"]["figures"]["children_left"] == [] and checks["cleanup"]["figures"]["workdir_removed"]
    assert "| dp_ddp_pair | **pass** |" in (out / "report.md").read_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where no CUDA device is visible")
def test_doctor_gpu_refuses_cleanly_without_cuda(tmp_path):
    proc = subprocess.run([*DDPVIZ, "doctor", "--gpu", "--out", str(tmp_path / "r")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "ddpviz doctor: no CUDA device visible" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not (tmp_path / "r").exists()  # refused before anything ran


def test_run_check_turns_outcomes_into_verdicts():
    logged = []
    ok = run_check("a", lambda: ("fine", {"x_s": 1.5}), logged.append)
    assert (ok.verdict, ok.detail, ok.figures) == ("pass", "fine", {"x_s": 1.5})

    def failing():
        raise CheckFailed("3 of 5 failed", {"failed": 3})

    def skipping():
        raise CheckSkipped("no GPU")

    def crashing():
        return {}["missing"]

    assert (run_check("b", failing, logged.append).verdict, run_check("b", failing, logged.append).figures) == \
        ("fail", {"failed": 3})
    assert run_check("c", skipping, logged.append).verdict == "skip"
    crash = run_check("d", crashing, logged.append)
    assert crash.verdict == "fail" and crash.detail == "KeyError: 'missing'" and "traceback_tail" in crash.figures
    assert any("b: fail" in line for line in logged)


def test_report_fails_on_any_failure_but_not_on_a_skip(tmp_path):
    report = Report(checks=[Check("a"), Check("b", "skip", "no GPU")])
    assert report.ok
    report.add(Check("c", "fail", "broke | badly", {"n": 1}))
    assert not report.ok
    js, md = report.write(tmp_path)
    data = json.loads(js.read_text())
    assert data["ok"] is False and [c["verdict"] for c in data["checks"]] == ["pass", "skip", "fail"]
    text = md.read_text()
    assert "FAILED" in text and "| c | **fail** | 0.0 | broke \\| badly |" in text
    with pytest.raises(ValueError, match="verdict must be one of"):
        Check("x", "ok")


def test_exports_read_back_catches_a_short_file(tmp_path):
    from ddpviz.workers.doctor.checks import _read_back

    events = [{"type": "step", "step": i} for i in range(3)] + [{"type": "run_finished"}]
    path = tmp_path / "r.steps.csv"
    path.write_text("step\n0\n1\n")  # a row short
    with pytest.raises(CheckFailed, match="2 rows for 3 step events"):
        _read_back("csv", path, events)
    path.write_text("step\n0\n1\n2\n")
    assert _read_back("csv", path, events) == {"rows": 3}


@pytest.mark.slow
def test_cleanup_check_finds_a_process_left_behind(tmp_path):
    script = textwrap.dedent(f"""
        import subprocess, sys
        from pathlib import Path
        from ddpviz.workers.doctor.checks import DoctorStack, check_cleanup
        from ddpviz.workers.doctor.report import CheckFailed
        stray = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        work = Path({str(tmp_path / "work")!r}); work.mkdir()
        try:
            check_cleanup(DoctorStack(work))
            print("PASSED")
        except CheckFailed as exc:
            print("FAILED", [c["pid"] for c in exc.figures["children_left"]] == [stray.pid], exc.figures["workdir_removed"])
        finally:
            stray.kill()
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.stdout.split() == ["FAILED", "True", "True"], proc.stdout + proc.stderr


@pytest.mark.slow
def test_a_doctor_stopped_half_way_stops_what_it_started_and_keeps_its_findings(tmp_path):
    import os
    import signal
    import time

    import psutil

    out = tmp_path / "r"
    proc = subprocess.Popen([*DDPVIZ, "doctor", "--out", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # the worker is up once its check is in the report
        if (out / "report.json").exists() and "worker" in (out / "report.json").read_text():
            break
        time.sleep(0.2)
    kids = psutil.Process(proc.pid).children(recursive=True)
    assert kids, "the doctor should have a worker and a Redis running now"
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    gone, alive = psutil.wait_procs(kids, timeout=10)
    assert alive == []
    checks = {c["name"]: c["verdict"] for c in json.loads((out / "report.json").read_text())["checks"]}
    assert checks["worker"] == "pass" and checks["cleanup"] == "pass"
