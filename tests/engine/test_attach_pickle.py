"""A script that saves its DDP or model whole (`torch.save(ddp)`, `pickle.dumps`, `copy.deepcopy`) does so
attached as without ddpviz, and the copy trains to the same numbers. Reference: the same script in a process
without ddpviz. Before 2026-12-06 the attached save failed ("cannot pickle '_io.FileIO' object"): the DDP's
forward hooks, `_ddpviz_watch` and comm hook state reached ddpviz's open event file. Not covered: a save
inside a memory-traced step (steps 0-2, every 200th), whose phase hooks are local functions."""

from __future__ import annotations

import subprocess
import sys

import pytest
from attach_process import EPILOGUE, PREAMBLE, plain_and_attached

SCRIPT = PREAMBLE + r"""
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
torch.manual_seed(0)
ddp = DDP(torch.nn.Linear(4, 1))
hooked = DDP(torch.nn.Linear(4, 1))
hooked.register_comm_hook(None, default_hooks.allreduce_hook)  # the script's own hook: ddpviz wraps it
builtin = DDP(torch.nn.Linear(4, 1))
builtin._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)  # run as its Python twin under the hook
models = (("plain", ddp), ("hooked", hooked), ("builtin", builtin))
opt = torch.optim.SGD([p for _, m in models for p in m.parameters()], lr=0.1)
for _ in range(3):  # whole steps: saved between steps, as checkpoints are
    sum(m(torch.randn(2, 4)).sum() for _, m in models).backward()
    opt.step()
    opt.zero_grad()
for name, m in models:  # for the loader below, in a process without ddpviz
    torch.save(m, os.path.join(os.environ["DDPVIZ_ATTACH_SPOOL"], name + ".pt"))
x = torch.ones(3, 4)
def saved(m):
    b = io.BytesIO()
    torch.save(m, b)
    b.seek(0)
    return torch.load(b, weights_only=False)

for how, save in (("torch.save", saved), ("pickle", lambda m: pickle.loads(pickle.dumps(m))), ("deepcopy", copy.deepcopy)):
    for what, m in (("ddp", ddp), ("model", ddp.module)):
        try:
            print(how, what, f"{save(m)(x).sum().item():.6f}")
        except Exception as exc:
            print(how, what, type(exc).__name__, exc)
""" + EPILOGUE


SAID = ("torch.save", "pickle", "deepcopy")  # the script's result lines

# where ddpviz cannot be imported (an inference box): every file loads, runs and holds what a plain save holds
LOADER = r"""
import os, socket, sys
sys.modules["ddpviz"] = None  # import ddpviz raises here
import torch, torch.distributed as dist
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{port}")
for folder in sys.argv[1:]:
    for name in ("plain", "hooked", "builtin"):
        path = os.path.join(folder, name + ".pt")
        m = torch.load(path, weights_only=False)
        hooks = [len(getattr(m, a)) for a in sorted(vars(m)) if a.startswith("_forward") and isinstance(getattr(m, a), dict)]
        print("loaded", os.path.basename(folder), name, f"{m(torch.ones(3, 4)).sum().item():.6f}", hooks,
              [h.__qualname__ for h, _ in m._comm_hooks], b"ddpviz" in open(path, "rb").read(),
              [a for a in vars(m) if "ddpviz" in a])
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pickle")
    return tmp, plain_and_attached(tmp, SCRIPT, SAID)


def test_a_ddp_or_model_saved_whole_is_saved_and_loads_as_without_ddpviz(runs):
    _, (plain, attached) = runs
    assert len(plain) == 6 and all(len(line.split(" ")) == 3 for line in plain), plain  # every save worked
    assert attached == plain


def test_a_ddp_saved_whole_attached_loads_where_ddpviz_is_not_installed_and_holds_what_a_plain_save_holds(runs):
    tmp, _ = runs
    out = subprocess.run([sys.executable, "-c", LOADER, str(tmp / "plain"), str(tmp / "attached")],
                         capture_output=True, text=True, timeout=120, cwd=tmp,
                         env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    loaded = {how: [line.replace(f" {how} ", " ", 1) for line in out.stdout.splitlines()
                    if line.startswith(f"loaded {how} ")] for how in ("plain", "attached")}
    assert len(loaded["plain"]) == 3 and "allreduce_hook" in loaded["plain"][1], loaded["plain"]
    assert loaded["attached"] == loaded["plain"]
