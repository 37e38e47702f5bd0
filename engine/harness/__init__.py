"""Runs that measure the instrument itself, or several runs side by side.

    compare      `ddpviz compare`: single, DP, DDP (and FSDP) on one config, side by side
    overhead     plain torch DDP against ddpviz's DDP on the same work, taking turns
    interleaved  several ddpviz runs started at once, training in turns
    gpu_checks   the torch side of `ddpviz doctor --gpu`: probes of the CUDA paths
    attach_sync  `doctor --gpu`'s probe that an attached DDP adds no host-device synchronisation
    launched_sync  `doctor --gpu`'s probe that a launched DDP rank synchronises only on its instrumented steps
    bucket_cost  what ddpviz's DDP adds per bucket and per step against plain torch DDP (`ddpviz bench --bucket-cost`)
    flight_cost  what reading PyTorch's flight recorder costs per entry held, and how much of a dump holds the GIL
"""
