"""A comm hook the script registers on an attached DDP gets DDP's own checks (`_check_comm_hook`) and its
name in DDP's logging data, as without ddpviz. Reference: the same registrations in a process without
ddpviz. Before 2026-12-06 ddpviz took the hook without DDP's checks: a bf16 hook on gloo, which DDP refuses
("BF16 all reduce communication hook required CUDA 11+ and NCCL 2.10+"), trained attached."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = r'''
import os, socket, sys
if sys.argv[1] == "attached":
    from ddpviz.engine.attach import install
    install()
import torch, torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{port}")

def annotated(state, bucket: int) -> torch.futures.Future[torch.Tensor]:
    return default_hooks.allreduce_hook(state, bucket)

for hook in (default_hooks.bf16_compress_hook, annotated, default_hooks.fp16_compress_hook):
    ddp = DDP(torch.nn.Linear(4, 1))
    try:
        ddp.register_comm_hook(None, hook)
        print(hook.__name__, "registered", ddp._get_ddp_logging_data().get("comm_hook"))
    except Exception as exc:
        print(hook.__name__, type(exc).__name__, str(exc).splitlines()[0])
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
'''


def _run(tmp_path, how: str) -> list[str]:
    spool = tmp_path / how
    spool.mkdir()
    out = subprocess.run([sys.executable, "-c", SCRIPT, how], capture_output=True, text=True, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "DDPVIZ_ATTACH_RUN_ID": "checks",
                              "DDPVIZ_ATTACH_SPOOL": str(spool), "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    return [line for line in out.stdout.splitlines() if line.split(" ")[0] in ("bf16_compress_hook", "annotated",
                                                                              "fp16_compress_hook")]


def test_the_scripts_hook_is_checked_and_named_as_ddp_does_without_ddpviz(tmp_path):
    plain, attached = _run(tmp_path, "plain"), _run(tmp_path, "attached")
    assert len(plain) == 3 and plain[0].startswith("bf16_compress_hook TypeError BF16 all reduce"), plain
    assert plain[1].startswith("annotated ValueError") and plain[2] == "fp16_compress_hook registered fp16_compress_hook"
    assert attached == plain
