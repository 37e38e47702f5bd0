"""Independent reference for FSDP's byte accounting: the kernel's loopback counters.

Two or three spawned gloo processes run one all-gather and one reduce-scatter of the same
full-size tensor (the two collectives FSDP2 issues), each alone between barriers, and rank 0
reads how many bytes crossed the loopback interface (`psutil.net_io_counters`, from
/proc/net/dev) during each. Other processes' loopback traffic can only add bytes, so each op
runs several times and its smallest count is kept.
"""

import time

import psutil
import torch
import torch.distributed as dist

# before any process group: imported later (DDP's constructor does, through torch._dynamo) its
# `group=group.WORLD` defaults pin the gloo group past destroy_process_group() into exit (SIGABRT)
import torch.distributed.nn.functional  # noqa: F401,E402

NUMEL = 6 * 2**20  # 24 MiB of fp32, divisible by 2 and 3
REPEATS = 5  # the machine's loopback is shared: the least of several counts is the op's own


def _lo_bytes() -> int:
    return psutil.net_io_counters(pernic=True)["lo"].bytes_sent


def _worker(rank, world, port, out, _q):
    from ref_procs import join_gloo

    join_gloo(rank, world, port)
    full, shard = torch.ones(NUMEL), torch.ones(NUMEL // world)
    ops = {"all_gather": lambda: dist.all_gather_into_tensor(full, shard),
           "reduce_scatter": lambda: dist.reduce_scatter_tensor(shard, full, op=dist.ReduceOp.AVG)}
    measured: dict[str, int] = {}
    for _ in range(REPEATS):  # other traffic only adds bytes: keep each op's smallest count
        for name, op in ops.items():
            dist.barrier()
            time.sleep(0.05)
            before = _lo_bytes()
            op()
            dist.barrier()
            measured[name] = min(measured.get(name, 1 << 62), _lo_bytes() - before)
    if rank == 0:
        torch.save(measured, out)
    dist.destroy_process_group()


def loopback_bytes(world: int, out: str) -> dict[str, int]:
    """Loopback bytes (all ranks together) of one all-gather and one reduce-scatter of NUMEL fp32."""
    from ref_procs import run_reference

    from engine.modes.launcher import free_port

    run_reference(_worker, (world, free_port(), out), nprocs=world)
    return torch.load(out)
