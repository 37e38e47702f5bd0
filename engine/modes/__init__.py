"""The training modes, one per way of using several devices. No mode imports another mode.

    single      `mode=single`: one device, the whole global batch (the baseline)
    dp/         `mode=dp`: DataParallel, one process, a thread per device (CPU emulation and CUDA)
    ddp/        `mode=ddp`: a process per rank, bucketed all-reduce overlapping backward
    fsdp/       `mode=fsdp`: FSDP2 (`fully_shard`), a process per rank, sharded parameters
    launcher    starts rank processes (DDP, FSDP) with torch.distributed's elastic launch
    ranks       the one bootstrap every rank process runs (files, errors, process group)
    fork_server imported by the rank fork server alone: it dies with its launcher
"""
