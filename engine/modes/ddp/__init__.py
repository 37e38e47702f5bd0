"""`mode=ddp`: DistributedDataParallel — a process per rank, gradients all-reduced in buckets.

    rank        what each rank process runs (via `engine.modes.ranks`)
    comm_hook   the comm hook that all-reduces each bucket and records when it happened
    comm_hooks  gradient compression: PyTorch's fp16/bf16/PowerSGD hooks (or a user's) composed with
                the recording hook, bytes counted on what they hand to all-reduce
    buckets     the bucket layout, before anything launches, by PyTorch's own assignment rule
    memory      what a DDP rank adds to memory tracing and the replica check
    probe       the all-reduce probe on the run's own process group (nccl-tests style)
flight      `bucket_timing=recorder`: which runs take it; PyTorch's flight recorder (attached NCCL's sampled steps)
reducer     `bucket_timing=recorder`: every step's buckets from DDP's reducer (layout, stamps), no Python per bucket
sampled     `bucket_timing=recorder` on sampled steps: full bucket spans from PyTorch's profiler
"""
