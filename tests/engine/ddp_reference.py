"""Independent reference for the DDP tests: plain PyTorch DDP in two spawned gloo processes.

Rank processes build the same model twice — DDP with PyTorch's default all-reduce, and DDP with
ddpviz's recording hook — train both on the same shard, and report PyTorch's own bucket sizes
(`_get_ddp_logging_data()`) and how far the hooked gradients are from
the default hook's and from one device's gradient on the whole global batch.
"""


import torch
import torch.distributed as dist

# before any process group: imported later (DDP's constructor does, through torch._dynamo) its
# `group=group.WORLD` defaults pin the gloo group past destroy_process_group() into exit (SIGABRT)
import torch.distributed.nn.functional  # noqa: F401,E402
from torch.nn.parallel import DistributedDataParallel as DDP

from ddpviz.engine.components.training import loss_fn
from ddpviz.engine.config import RunConfig
from ddpviz.engine.data import BatchPlan, load_dataset
from ddpviz.engine.models import build_model
from ddpviz.engine.modes.ddp.comm_hook import BucketRecorder, recording_hook


def _worker(rank, world, port, cfg_dict, steps, out):
    from ref_procs import join_gloo

    join_gloo(rank, world, port)
    cfg = RunConfig(**cfg_dict)
    ds = load_dataset(cfg)
    plan = BatchPlan(len(ds), world, cfg.micro_batch_per_device, cfg.seed)
    ref = DDP(build_model(cfg, ds), bucket_cap_mb=cfg.bucket_cap_mb)
    mine_model = build_model(cfg, ds)
    mine = DDP(mine_model, bucket_cap_mb=cfg.bucket_cap_mb)
    names = {p.data_ptr(): n for n, p in mine_model.named_parameters()}
    rec = BucketRecorder(world, cfg.overlap, names)
    mine.register_comm_hook(rec, recording_hook)
    single = build_model(cfg, ds)
    diff_ref = diff_single = 0.0
    for step in range(steps):
        idx = plan.rank_indices(step, rank)
        x, y = ds.x_train[idx], ds.y_train[idx]
        for m in (ref, mine):
            m.zero_grad(set_to_none=True)
        loss_fn(ref(x), y).backward()
        rec.begin_backward()
        loss_fn(mine(x), y).backward()
        single.zero_grad(set_to_none=True)
        g = plan.global_indices(step)
        loss_fn(single(ds.x_train[g]), ds.y_train[g]).backward()  # full global batch, one device
        for a, b, c in zip(ref.parameters(), mine.parameters(), single.parameters()):
            diff_ref = max(diff_ref, (a.grad - b.grad).abs().max().item())
            diff_single = max(diff_single, (c.grad - b.grad).abs().max().item())
        with torch.no_grad():  # same SGD step on all three so later steps compare too
            for a, b, c in zip(ref.parameters(), mine.parameters(), single.parameters()):
                a -= 0.1 * a.grad
                b -= 0.1 * b.grad
                c -= 0.1 * c.grad
    if rank == 0:
        data = ref._get_ddp_logging_data()
        out.put(dict(bucket_sizes=data.get("bucket_sizes"), logging_keys=sorted(data), rebuilt=data.get("rebuilt_bucket_sizes"), max_diff_vs_default_hook=diff_ref,
                     max_diff_vs_single=diff_single, recorded=[r["nbytes"] for r in rec.resolved()],
                     grad_scale=max(p.grad.abs().max().item() for p in single.parameters())))
    dist.barrier()


def reference_run(cfg: RunConfig, steps: int = 3) -> dict:
    """Run the reference on 2 ranks; returns rank 0's bucket sizes, gradients and recorded bytes."""
    from ref_procs import run_reference

    from ddpviz.engine.modes.launcher import free_port

    return run_reference(_worker, (2, free_port(), cfg.to_json_dict(), steps), nprocs=2, results=1)[0]
