"""An attached process lets go of the script's DDP at exit (engine.attach: `StepTracker.release`,
`MemoryWatch.close`): a DDP and model the script no longer holds are freed while the interpreter is
alive, as without ddpviz. Before, the step tracker's watches kept every watched DDP — its model,
gradients, process group and gloo threads — until interpreter finalization.

The reference is Python's own weak references to the script's DDP and model, read after ddpviz's
exit handler ran (the script keeps none itself)."""

from __future__ import annotations

import subprocess
import sys

# ddpviz installed, then a one-process gloo group on a free port (both scripts below)
ATTACHED_GROUP = r'''
from ddpviz.engine.attach import install
install()
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{port}")
'''

SCRIPT = r'''
import atexit, gc, os, socket, weakref
''' + ATTACHED_GROUP + r'''
def train():
    ddp = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for _ in range(3):
        ddp(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
    return weakref.ref(ddp), weakref.ref(ddp.module)

refs = train()
dist.destroy_process_group()
gc.collect()
recorded = len(os.listdir(os.environ["DDPVIZ_ATTACH_SPOOL"])) > 0
atexit._run_exitfuncs()  # ddpviz's exit handler, as at the interpreter's exit
print("recorded", recorded, "alive", [r() is not None for r in refs], flush=True)
os._exit(0)
'''


def test_the_scripts_dropped_ddp_and_model_are_freed_at_exit_not_at_finalization(tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "DDPVIZ_ATTACH_RUN_ID": "release",
                              "DDPVIZ_ATTACH_SPOOL": str(spool), "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "recorded True alive [False, False]" in out.stdout, out.stdout + out.stderr[-2000:]


CRASHING = r'''
import atexit, gc, os, socket, sys
calls, real = [], gc.collect
gc.collect = lambda *a, **k: calls.append(a) or real(*a, **k)
atexit.register(lambda: print("full collections at exit", len(calls), flush=True))  # runs after ddpviz's handler
''' + ATTACHED_GROUP + r'''ddp = DDP(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
for step in range(3):
    ddp(torch.randn(2, 4)).sum().backward()
    opt.step()
    opt.zero_grad()
if sys.argv[1] == "raise":
    raise RuntimeError("the script's own failure")
'''


def test_a_process_ending_in_an_uncaught_exception_is_not_held_up_by_a_full_collection(tmp_path):
    """After an uncaught exception the script's traceback holds its DDP until finalization, with ddpviz or without;
    ddpviz's exit handler then runs no full collection (170-220 ms with torch loaded), which kept a crashed rank
    alive until torchrun's SIGTERM reached it. A clean exit still collects (the test above: what it frees)."""
    said = {}
    for how in ("raise", "return"):
        spool = tmp_path / how
        spool.mkdir()
        out = subprocess.run([sys.executable, "-c", CRASHING, how], capture_output=True, text=True, timeout=120,
                             env={"PATH": "/usr/bin:/bin", "DDPVIZ_ATTACH_RUN_ID": "crash",
                                  "DDPVIZ_ATTACH_SPOOL": str(spool), "OMP_NUM_THREADS": "1"})
        assert out.returncode == (1 if how == "raise" else 0), out.stderr[-3000:]
        said[how] = [line for line in out.stdout.splitlines() if line.startswith("full collections")]
    assert said == {"raise": ["full collections at exit 0"], "return": ["full collections at exit 1"]}, said
