"""One Python process on a script, with ddpviz's attach installed in it or not (the script reads `sys.argv[1]`:
"attached" installs it), for tests that compare what a script does with and without ddpviz."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


# a script's start: ddpviz installed or not (argv[1]), then a one-process gloo group on a free port
PREAMBLE = r'''
import copy, io, os, pickle, socket, sys
if sys.argv[1] == "attached":
    from ddpviz.engine.attach import install
    install()
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{port}")
'''


# its end: the group closed, what it printed flushed, and out with no exit handler (ddpviz's would write more)
EPILOGUE = r'''
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
'''


def plain_and_attached(tmp: Path, script: str, prefixes: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """`run_script` without ddpviz, then with it: (plain lines, attached lines)."""
    return run_script(tmp, script, "plain", prefixes), run_script(tmp, script, "attached", prefixes)


def run_script(tmp: Path, script: str, how: str, prefixes: tuple[str, ...]) -> list[str]:
    """Run `script` as ``python -c SCRIPT HOW`` with a run id and a spool under `tmp`; its stdout lines that
    start with one of `prefixes`. Asserts the process exited 0."""
    spool = tmp / how
    spool.mkdir()
    out = subprocess.run([sys.executable, "-c", script, how], capture_output=True, text=True, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "DDPVIZ_ATTACH_RUN_ID": "compare",
                              "DDPVIZ_ATTACH_SPOOL": str(spool), "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    return [line for line in out.stdout.splitlines() if line.split(" ")[0] in prefixes]
