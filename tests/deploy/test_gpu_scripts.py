"""scripts/gpu_check.sh up to the point where CUDA is needed, with this machine playing the GPU host.

The driver/CUDA test gives the script a Python whose `pynvml` and `torch` are stand-ins (a CUDA 12.4
driver, PyPI's CUDA 13.0 torch that therefore sees no device): the mismatch must be named, with
its fix, before the doctor starts. scripts/gpu_wheels.sh needs a package index and is tried by
hand (docs/gpu/README.md records the run).
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def gpu_check(*args: str, env: dict | None = None, python: str = sys.executable) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), "--system-python", python, *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})


def host_python(tmp_path: Path, *paths: Path) -> str:
    """A Python that has this one's packages but not ddpviz installed, as a GPU host's own Python: `-S`
    (no site: .pth files, the editable install's finder among them, are not read) with `paths` and the
    site-packages folders on its path."""
    import site

    wrapper = tmp_path / "host-python"
    path = os.pathsep.join([*map(str, paths), *site.getsitepackages()])
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="$PYTHONPATH:{path}" exec {sys.executable} -S "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def test_a_cuda_13_torch_on_a_cuda_12_driver_is_named_before_anything_runs(tmp_path):
    fake = tmp_path / "fake"
    (fake / "torch").mkdir(parents=True)
    (fake / "pynvml.py").write_text(textwrap.dedent("""
        def nvmlInit(): pass
        def nvmlShutdown(): pass
        def nvmlSystemGetDriverVersion(): return "550.54.15"
        def nvmlSystemGetCudaDriverVersion(): return 12040
    """))
    (fake / "torch" / "__init__.py").write_text(textwrap.dedent("""
        from types import SimpleNamespace
        __version__ = "2.13.0"
        version = SimpleNamespace(cuda="13.0")
        cuda = SimpleNamespace(is_available=lambda: False, device_count=lambda: 0)
    """))
    out = tmp_path / "out"
    # ddpviz not installed in the host's Python: the script's PYTHONPATH must make the checkout importable
    proc = gpu_check("--out", str(out), python=host_python(tmp_path, fake))
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text
    assert "driver 550.54.15 (CUDA 12.4 at most); torch 2.13.0 built for CUDA 13.0" in text
    assert "driver/CUDA mismatch" in text and "driver >= 580.65.06" in text and "torch==2.10.0" in text
    assert "torch sees no CUDA device" in text and not out.exists()  # the doctor never started


def test_a_torch_wheel_is_refused_and_the_hosts_own_packages_are_not_reinstalled(tmp_path):
    wheels = tmp_path / "w"
    wheels.mkdir()
    (wheels / "redis-9.9.9-py3-none-any.whl").write_bytes(b"")  # this Python has redis: left alone
    (wheels / "torch-2.13.0-cp312-cp312-manylinux_2_28_x86_64.whl").write_bytes(b"")
    proc = gpu_check("--wheels", str(wheels), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and "ddpviz never installs torch" in proc.stderr, proc.stderr
    (wheels / "torch-2.13.0-cp312-cp312-manylinux_2_28_x86_64.whl").unlink()
    proc = gpu_check("--wheels", str(wheels), "--out", str(tmp_path / "out"), env={"PYTHONPATH": ""})
    assert "redis: the host has it, not installed" in proc.stderr
    assert "installing" not in proc.stderr  # nothing left to install: pip never ran
    assert "every ddpviz requirement is met" in proc.stderr


def test_a_missing_requirement_is_named_before_anything_runs(tmp_path):
    """A host Python without ddpviz's stack: a bare virtual environment (no pip, no packages)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True, timeout=60)
    proc = subprocess.run(["bash", str(SCRIPT), "--system-python", str(tmp_path / "bare" / "bin" / "python"),
                           "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": ""})
    assert proc.returncode == 2 and "gpu_check: not usable here:" in proc.stderr, proc.stderr
    assert "torch (missing)" in proc.stderr and "redis (missing)" in proc.stderr and "gpu_wheels.sh" in proc.stderr
    assert not (tmp_path / "o").exists()


def test_gpu_diag_runs_its_steps_on_cpu_and_leaves_its_files(tmp_path):
    """scripts/gpu_diag.sh --cpu (issue 31's diagnostic, tried where there is no GPU): the flight recorder's cost,
    then a hook and a recorder run, each profiled (cProfile of the training thread without py-spy)."""
    import json
    import pstats

    out = tmp_path / "diag"
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_diag.sh"), "--system-python", sys.executable, "--out",
                           str(out), "--cpu"], capture_output=True, text=True, timeout=240)
    log = (out / "diag.log").read_text()
    assert proc.returncode == 0, log[-3000:]
    assert json.loads((out / "flight_cost.json").read_text())["rows"][0]["entries"] > 0
    for timing in ("hook", "recorder"):
        assert f"train {timing} rc=0" in log
        assert pstats.Stats(str(out / f"rank0-{timing}.pstats")).total_calls > 0
    attach = json.loads((out / "attach.json").read_text())  # the script's own times, both sides, one round
    assert attach["n_plain"] > 0 and attach["n_attached"] > 0 and attach["backend"] == "gloo", attach
    assert [r["run_steps"] >= r["script_steps"] > 0 for r in attach["attached_runs"]] == [True]


def test_gpu_diag_says_a_failed_step_and_exits_1(tmp_path):
    """A Python without torch: every step fails, and the script says which and exits 1 (it exited 0 before)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True, timeout=60)
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_diag.sh"), "--system-python",
                           str(tmp_path / "bare" / "bin" / "python"), "--out", str(tmp_path / "d"), "--cpu"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": ""})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "gpu_diag: failed: flight_cost train-hook train-recorder attach" in proc.stderr
