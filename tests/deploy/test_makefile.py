"""The Makefile's TORCH_PIN, run for real with a stand-in pip that logs the words it was given.

Reference: the shell's own word splitting — what pip receives as argv — and make's decision to
run a recipe or not (a stamp file named after the pin)."""

import os
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CU126 = "torch==2.10.0 --index-url https://download.pytorch.org/whl/cu126"


@pytest.fixture
def venv(tmp_path):
    """A .venv whose python exists (nothing to create) and whose pip logs one call per line."""
    bin_ = tmp_path / ".venv" / "bin"
    bin_.mkdir(parents=True)
    (bin_ / "python").write_text("#!/bin/sh\nexit 0\n")
    log = tmp_path / "pip.log"
    (bin_ / "pip").write_text(f'#!/bin/sh\nprintf "%s|" "$@" >> {log}\necho >> {log}\n')
    for f in ("python", "pip"):
        (bin_ / f).chmod((bin_ / f).stat().st_mode | stat.S_IXUSR)
    return tmp_path


def make_install(venv: Path, pin: str | None) -> list[list[str]]:
    """Run `make install` against `venv`; returns pip's calls (argv lists) this time."""
    log = venv / "pip.log"
    log.unlink(missing_ok=True)
    args = ["make", "-s", "-C", str(ROOT), "install", f"VENV={venv / '.venv'}"]
    if pin is not None:
        args.append(f"TORCH_PIN={pin}")
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60, env={**os.environ, "MAKEFLAGS": ""})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [line.rstrip("|").split("|") for line in log.read_text().splitlines()] if log.exists() else []


def test_a_pin_with_an_index_url_reaches_pip_as_separate_words(venv):
    calls = make_install(venv, CU126)
    assert calls[0] == ["install", "-q", "--no-compile", "torch==2.10.0", "--index-url",
                        "https://download.pytorch.org/whl/cu126"]
    assert calls[1] == ["install", "-q", "--no-compile", "-e", "."]


def test_a_changed_pin_reinstalls_torch_and_the_same_pin_does_nothing(venv):
    make_install(venv, None)  # the default pin
    assert make_install(venv, None) == []  # up to date
    calls = make_install(venv, CU126)
    assert calls[0] == ["uninstall", "-q", "-y", "torch"]  # same version, other build: pip would keep the old
    assert calls[1][3:] == ["torch==2.10.0", "--index-url", "https://download.pytorch.org/whl/cu126"]
    assert calls[2][-2:] == ["-e", "."]
    assert make_install(venv, CU126) == []
    assert [p.name for p in (venv / ".venv").glob(".torch-*")] == \
        ["." + "torch-torch==2.10.0_--index-url_https___download.pytorch.org_whl_cu126"]


def test_an_empty_pin_keeps_the_torch_in_the_venv(venv):
    make_install(venv, None)
    calls = make_install(venv, "")
    assert not any(c[0] in ("uninstall",) or "torch" in " ".join(c) for c in calls), calls
