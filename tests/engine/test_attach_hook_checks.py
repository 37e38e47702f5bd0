"""A comm hook the script registers on an attached DDP gets DDP's own checks (`_check_comm_hook`) and its
name in DDP's logging data, as without ddpviz. Reference: the same registrations in a process without
ddpviz. Before 2026-12-06 ddpviz took the hook without DDP's checks: a bf16 hook on gloo, which DDP refuses
("BF16 all reduce communication hook required CUDA 11+ and NCCL 2.10+"), trained attached."""

from __future__ import annotations

from attach_process import EPILOGUE, PREAMBLE, plain_and_attached

SCRIPT = PREAMBLE + r'''
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

def annotated(state, bucket: int) -> torch.futures.Future[torch.Tensor]:
    return default_hooks.allreduce_hook(state, bucket)

for hook in (default_hooks.bf16_compress_hook, annotated, default_hooks.fp16_compress_hook):
    ddp = DDP(torch.nn.Linear(4, 1))
    try:
        ddp.register_comm_hook(None, hook)
        print(hook.__name__, "registered", ddp._get_ddp_logging_data().get("comm_hook"))
    except Exception as exc:
        print(hook.__name__, type(exc).__name__, str(exc).splitlines()[0])
''' + EPILOGUE


SAID = ("bf16_compress_hook", "annotated", "fp16_compress_hook")  # the script's result lines


def test_the_scripts_hook_is_checked_and_named_as_ddp_does_without_ddpviz(tmp_path):
    plain, attached = plain_and_attached(tmp_path, SCRIPT, SAID)
    assert len(plain) == 3 and plain[0].startswith("bf16_compress_hook TypeError BF16 all reduce"), plain
    assert plain[1].startswith("annotated ValueError")
    assert plain[2] == "fp16_compress_hook registered fp16_compress_hook"
    assert attached == plain
