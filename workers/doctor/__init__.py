"""``ddpviz doctor [--gpu] [--out DIR]``: prove this installation works, end to end, in one command.

    checks   the checks on any machine (Redis, a worker, a DP/DDP pair, exports, clean-up)
    gpu      the CUDA checks (``--gpu``), each with a verdict and its figures
    report   one verdict and its figures per check, as JSON and Markdown; stop signals kept per check
    versions the NVIDIA driver against the CUDA torch was built for, and a mismatch named
    shots    screenshots of the doctor's GPU runs (Live, Bucket timeline)
cost     the instrument's cost at 0.1, 1 and 25 MB buckets, in µs per bucket
"""
