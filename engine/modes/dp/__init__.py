"""`mode=dp`: DataParallel — one process, one thread per device, device 0 at the centre.

    emulated    the run: virtual CPU devices, or hands over to `cuda` on real GPUs
    cuda        DP on GPUs with torch.nn.parallel's own functions, each phase timed
    replicate   DP's `replicate` on virtual CPU devices: new replica modules every step
    comm        torch.nn.parallel's coalesced copies on CPU: 10 MiB flat broadcast and reduce, whole-output gather
    state       what replicas write to module state and DP discards (buffers), measured
    hooks       where DP's work happens: forward threads and autograd hooks, per device
    book        the bookkeeping of one DP step (phases, bytes), checkable on any machine
"""
