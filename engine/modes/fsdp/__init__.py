"""`mode=fsdp`: FSDP2 (`torch.distributed.fsdp.fully_shard`) — a process per rank, 1/n of every
parameter, gradient and optimizer state per rank.

    rank         what each rank process runs (via `engine.modes.ranks`)
    step         one rank's training step and its sampled-step events
    units        which sub-modules become FSDP units, their sizes, FSDP pre-flight
    collectives  FSDP2's all-gathers and reduce-scatters, recorded through its custom-comm hooks
    memory       what a rank holds, from the tensors alive at each sample
"""
