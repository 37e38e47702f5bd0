"""Independent reference for FSDP's byte accounting: the kernel's loopback counters.

Two or three spawned gloo processes run one all-gather and one reduce-scatter of the same
full-size tensor (the two collectives FSDP2 issues), each alone between barriers, and rank 0
reads how many bytes crossed the loopback interface (`psutil.net_io_counters`, from
/proc/net/dev) during each. Other traffic on the machine adds noise; the tensor is large enough
(24 MiB) that it stays small.
"""

import os
import time

import psutil
import torch
import torch.distributed as dist

NUMEL = 6 * 2**20  # 24 MiB of fp32, divisible by 2 and 3


def _lo_bytes() -> int:
    return psutil.net_io_counters(pernic=True)["lo"].bytes_sent


def _worker(rank, world, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    full, shard = torch.ones(NUMEL), torch.ones(NUMEL // world)
    ops = {"all_gather": lambda: dist.all_gather_into_tensor(full, shard),
           "reduce_scatter": lambda: dist.reduce_scatter_tensor(shard, full, op=dist.ReduceOp.AVG)}
    measured = {}
    for name, op in ops.items():
        dist.barrier()
        time.sleep(0.1)
        before = _lo_bytes()
        op()
        dist.barrier()
        measured[name] = _lo_bytes() - before
    if rank == 0:
        torch.save(measured, out)
    dist.destroy_process_group()


def loopback_bytes(world: int, out: str) -> dict[str, int]:
    """Loopback bytes (all ranks together) of one all-gather and one reduce-scatter of NUMEL fp32."""
    import torch.multiprocessing as mp
    from engine.launcher import free_port

    mp.spawn(_worker, args=(world, free_port(), out), nprocs=world)
    return torch.load(out)
