"""Helpers for the `ddpviz run` tests: torchrun commands for the example scripts, reading the
scripts' own reports, and the attached run's events."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import torch
from wtools import REPO, cli_env, ddpviz_argv

from ddpviz.workers.connection import free_port

EXAMPLES = REPO / "examples" / "attach"


def torchrun(script: str | Path, *args: str, nproc: int = 2) -> list[str]:
    """``python -m torch.distributed.run --nproc-per-node N --master-port P SCRIPT ARGS``; a `str` names a script
    of examples/attach, a `Path` is the script itself (one a test wrote)."""
    path = script if isinstance(script, Path) else EXAMPLES / script
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
            "--master-port", str(free_port()), str(path), *args]


# What a rank printed when it aborted at exit, after training, in a plain reference run (no ddpviz
# in the process): 3 times on 2026-12-04, 2 of train_fp16_hook.py (a Python comm hook, whose
# future callbacks run on gloo's threads) and 1 of train_fsdp2.py, each in a loaded suite run; 0 in
# 211 runs of the same two scripts looped under synthetic CPU load, 0 in the attached runs. The
# faulthandler dump (PYTHONFAULTHANDLER, tests/workers/wtools.py) shows a thread with no Python
# frame left: the interpreter was finalizing. Likeliest cause (not proven): a C++ thread of
# PyTorch's that needs the GIL after finalization began is made to exit by CPython, and the unwind
# ends in std::terminate. Not ddpviz's to fix; the reference is the training before it.
TEARDOWN_ABORT = "terminate called without an active exception"


def run_plain(cmd: list[str], report: Path, timeout: float = 600, **env_extra: str) -> subprocess.CompletedProcess:
    """The command without ddpviz, with the script's TRAIN_REPORT on. A reference killed by
    PyTorch's exit-time abort (`TEARDOWN_ABORT`) is run once more on a fresh port, saying so on
    stderr: the reference is the script's training, which that abort comes after."""
    env = cli_env(None, TRAIN_REPORT=str(report), **env_extra)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0 and TEARDOWN_ABORT in proc.stderr and "--master-port" in cmd:
        print(f"run_plain: the reference aborted at exit ({TEARDOWN_ABORT!r}); running it once more",
              file=sys.stderr)
        i = cmd.index("--master-port") + 1
        cmd = [*cmd[:i], str(free_port()), *cmd[i + 1:]]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    return proc


def run_attached(cmd: list[str], redis_url: str, report: Path, spool: Path, *extra: str,
                 timeout: float = 600, **env_extra: str) -> tuple[subprocess.CompletedProcess, str]:
    """``ddpviz run --spool SPOOL -- CMD``; returns the process and the run id it printed."""
    env = cli_env(redis_url, TRAIN_REPORT=str(report), **env_extra)
    proc = subprocess.run([*ddpviz_argv(), "run", "--spool", str(spool), *extra, "--", *cmd], env=env,
                          capture_output=True, text=True, timeout=timeout)
    return proc, run_id_of(proc.stderr)


def plain_and_attached(tmp: Path, script_text: str, redis_url: str, *args: str, timeout: float = 120,
                       ) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess, str]:
    """`script_text` written to TMP/script.py, run on 2 torchrun ranks without ddpviz, then under `ddpviz run`:
    (plain, attached, the run id). Asserts both exited 0."""
    script = tmp / "script.py"
    script.write_text(script_text)
    cmd = torchrun(script, *args)
    plain = run_plain(cmd, tmp / "plain.json", timeout=timeout)
    assert plain.returncode == 0, plain.stderr[-3000:]
    attached, run_id = run_attached(cmd, redis_url, tmp / "att.json", tmp / "spool", timeout=timeout)
    assert attached.returncode == 0, attached.stderr[-3000:]
    return plain, attached, run_id


def run_id_in(line: str) -> str | None:
    """The run id in a line `ddpviz run` printed, or None."""
    m = re.search(r"ddpviz: run ([0-9a-f]{16})", line)
    return m.group(1) if m else None


def run_id_of(stderr: str) -> str:
    m = re.search(r"ddpviz: run ([0-9a-f]{16})", stderr)
    assert m, f"no run id in the output:\n{stderr[-3000:]}"
    return m.group(1)


def reports(report: Path, nproc: int = 2) -> list[dict]:
    """The script's own report of each rank (TRAIN_REPORT)."""
    return [json.loads(Path(str(report).replace(".json", f".rank{r}.json")).read_text()) for r in range(nproc)]


def params(report: Path, rank: int = 0) -> dict[str, torch.Tensor]:
    return torch.load(str(report).replace(".json", f".rank{rank}.pt"))


def by_rank(events: list[dict], type_: str) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = defaultdict(list)
    for e in events:
        if e["type"] == type_:
            out[e["rank"]].append(e)
    return out


def ints(csv: str) -> list[int]:
    return [int(v) for v in csv.split(",") if v.strip()]


def assert_params_bitwise_equal(tmp: Path, ranks=(0, 1)) -> None:
    """Each rank's final parameters of the attached run (att.json's `.pt`) equal, bit for bit, those
    of the plain run (plain.json's) of the same script and seed."""
    for rank in ranks:
        with_, without = params(tmp / "att.json", rank), params(tmp / "plain.json", rank)
        assert with_.keys() == without.keys()
        for name in with_:
            assert torch.equal(with_[name], without[name]), (rank, name)
