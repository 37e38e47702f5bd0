"""What a worker knows and controls on its own host.

    gpus     this host's GPUs through NVML (nvidia-ml-py, imported as `pynvml`), without torch
    leases   per-host device leases in Redis: two runs on one host never share a GPU
    procs    child processes that can be stopped completely (own session and process group, and
             optionally SIGTERM when their parent dies)
    ports    who holds a TCP port here (`ddpviz up` names a ddpviz app left on its port)
    reaper   finding and stopping every process of one run, wherever it was reparented
    stop     why a running run should stop: a cancel, its time limit, a broken event stream
"""
