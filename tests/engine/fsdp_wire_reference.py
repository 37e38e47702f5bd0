"""Independent reference for FSDP's byte accounting: the kernel's loopback counters.

Two or three gloo processes run one all-gather and one reduce-scatter of the same
full-size tensor (the two collectives FSDP2 issues), each alone between barriers, and rank 0
reads how many bytes crossed the loopback interface (`psutil.net_io_counters`, from
/proc/net/dev) during each: it reads the counter before a barrier that every rank must pass
before the op, and again after a barrier that every rank enters only once its op is done.
Other processes' loopback traffic can only add bytes, so each op runs until two counts agree
(see `settled`) and its smallest count is kept.
"""

import psutil
import torch
import torch.distributed as dist

# before any process group: imported later (DDP's constructor does, through torch._dynamo) its
# `group=group.WORLD` defaults pin the gloo group past destroy_process_group() into exit (SIGABRT)
import torch.distributed.nn.functional  # noqa: F401,E402

NUMEL = 6 * 2**20  # 24 MiB of fp32, divisible by 2 and 3
# The machine's loopback is shared (the suite runs three test processes at once): other traffic only
# adds bytes, so an op runs until its two smallest counts agree within 1% (a quiet count repeats),
# at least MIN_REPEATS and at most MAX_REPEATS times, and the smallest is kept.
MIN_REPEATS, MAX_REPEATS = 3, 15


def settled(counts: list[int]) -> bool:
    """Two of `counts` agree within 1% at the bottom: the smallest is the op's own bytes."""
    low = sorted(counts)[:2]
    return len(low) == 2 and low[1] <= low[0] * 1.01


def _lo_bytes() -> int:
    return psutil.net_io_counters(pernic=True)["lo"].bytes_sent


def _worker(rank, world, port, out, _q):
    from ref_procs import join_gloo

    join_gloo(rank, world, port)
    full, shard = torch.ones(NUMEL), torch.ones(NUMEL // world)
    ops = {"all_gather": lambda: dist.all_gather_into_tensor(full, shard),
           "reduce_scatter": lambda: dist.reduce_scatter_tensor(shard, full, op=dist.ReduceOp.AVG)}
    counts: dict[str, list[int]] = {name: [] for name in ops}
    for round_ in range(MAX_REPEATS):
        for name, op in ops.items():
            dist.barrier()
            before = _lo_bytes()
            # No rank starts the op before rank 0 has read `before`: a rank leaving one barrier
            # early sent its shard into the socket buffers before rank 0's read (CI counted
            # 41,989,244 of 50,331,648 all-gather bytes at world 3: one 8 MiB shard missing).
            dist.barrier()
            op()
            dist.barrier()
            counts[name].append(_lo_bytes() - before)
        done = torch.tensor([int(round_ + 1 >= MIN_REPEATS and all(map(settled, counts.values())))])
        dist.broadcast(done, 0)  # rank 0's counts decide: every rank runs the same collectives
        if done.item():
            break
    if rank == 0:
        torch.save({name: min(c) for name, c in counts.items()}, out)


def loopback_bytes(world: int, out: str) -> dict[str, int]:
    """Loopback bytes (all ranks together) of one all-gather and one reduce-scatter of NUMEL fp32."""
    from ref_procs import run_reference

    from ddpviz.engine.modes.launcher import free_port

    run_reference(_worker, (world, free_port(), out), nprocs=world)
    return torch.load(out)
