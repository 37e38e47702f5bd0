"""The two step models of the scale-out predictor: DDP's bucket pipeline and DP's hub.

Pure functions of numbers (no torch, no events); `engine.predict.scaleout` feeds them a measured run.

DDP (one rank's step; every rank does the same work): the buckets become ready during backward
at measured fractions of it; their all-reduces run one after another on one stream, each
starting at max(its ready time, the previous one's end) and lasting the ring all-reduce time
t(b) = 2(n−1)·α + 2(n−1)/n · b/β (Thakur et al. 2005, "Optimization of collective communication
operations in MPICH", §4; Patarasuk & Yuan 2009). PyTorch's reducer launches buckets in index
order as they become ready (`Reducer::mark_bucket_ready`) and NCCL runs them on one stream.
gloo runs two at a time (its process group's two worker threads), sharing the link; the link's
work is the same either way, and the last all-reduce of a busy period ends when the work is
done whatever the order it is served in (a work-conserving server), so the exposed time is the
one-stream model's.
The tree (`tree_allreduce_s`) is the alternative NCCL also runs: the same bandwidth term to first
order, latency 2·⌈log2 n⌉·α instead of 2(n−1)·α (`NCCL_ALGO_NOTE` says when NCCL uses which).
Exposed communication is what ends after backward's compute: last end − backward (the engine's
`comm_exposed_s`).

DP (one process, device 0 at the centre, `torch.nn.DataParallel.forward`): each copy phase moves
its bytes through device 0's link, one device after another; the replicas' forward and backward
run in threads and the phase lasts as long as the slowest replica plus the thread dispatch.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence


def _nothing_to_exchange(n: int, beta_bytes_per_s: float) -> bool:
    """True for n = 1; raises ValueError for n < 1 or beta <= 0 (the all-reduce models' checks)."""
    if n < 1:
        raise ValueError(f"world_size must be >= 1 (got {n})")
    if not beta_bytes_per_s > 0:
        raise ValueError(f"beta_bytes_per_s must be > 0 (got {beta_bytes_per_s})")
    return n == 1


def ring_allreduce_s(nbytes: float, n: int, alpha_s: float, beta_bytes_per_s: float) -> float:
    """Ring all-reduce time of `nbytes` over `n` ranks: 2(n−1)·α + 2(n−1)/n · nbytes/β (s).

    0 for n = 1 (nothing to exchange).

    Raises:
        ValueError: n < 1 or beta <= 0.
    """
    if _nothing_to_exchange(n, beta_bytes_per_s):
        return 0.0
    return 2 * (n - 1) * alpha_s + 2 * (n - 1) / n * nbytes / beta_bytes_per_s


def tree_allreduce_s(nbytes: float, n: int, alpha_s: float, beta_bytes_per_s: float) -> float:
    """Tree all-reduce time of `nbytes` over `n` ranks: 2·⌈log2 n⌉·α + 2(n−1)/n · nbytes/β (s).
    Theory, as `ring_allreduce_s` is.

    A reduce up a binary tree and a broadcast down it, pipelined in chunks: the first chunk
    crosses ⌈log2 n⌉ levels each way, so the latency term grows with log2 n where the ring's
    grows with n − 1. NCCL runs two binary trees at once, each rank interior in one and a leaf in
    the other, each tree carrying half the data; a rank then sends and receives 2·nbytes, the
    ring's 2(n−1)/n·nbytes to first order in n, so the bandwidth term is the ring's (S. Jeaugey,
    "Massively Scale Your Deep Learning Training with NCCL 2.4", NVIDIA developer blog, 2019;
    nccl-tests doc/PERFORMANCE.md: all-reduce busbw = algbw · 2(n−1)/n whatever the algorithm).
    0 for n = 1.

    Raises:
        ValueError: n < 1 or beta <= 0.
    """
    if _nothing_to_exchange(n, beta_bytes_per_s):
        return 0.0
    return 2 * math.ceil(math.log2(n)) * alpha_s + 2 * (n - 1) / n * nbytes / beta_bytes_per_s


ALLREDUCE_MODELS: dict[str, Callable[[float, int, float, float], float]] = {
    "ring": ring_allreduce_s, "tree": tree_allreduce_s}

NCCL_ALGO_NOTE = (
    "Which one NCCL runs: its tuner picks an algorithm (and protocol) per call from the message "
    "size, the number of nodes, GPUs per node and the link bandwidths, with no simple rule "
    "(NVIDIA/nccl issue #754); trees span nodes, so inside one host the tree is a chain and its "
    "log2 n latency helps only across hosts, where NCCL tends to use the tree for small and "
    "medium messages and the ring for large ones (NCCL 2.4 blog). NCCL_ALGO=Ring or "
    "NCCL_ALGO=Tree forces one. gloo (CPU) runs its own ring-based all-reduce.")


def allreduce_s(algo: str, nbytes: float, n: int, alpha_s: float, beta_bytes_per_s: float) -> float:
    """`ALLREDUCE_MODELS[algo]` (s).

    Raises:
        ValueError: an unknown `algo` (names the choices), or what the model raises.
    """
    if algo not in ALLREDUCE_MODELS:
        raise ValueError(f"allreduce_algo must be one of {sorted(ALLREDUCE_MODELS)} (got {algo!r})")
    return ALLREDUCE_MODELS[algo](nbytes, n, alpha_s, beta_bytes_per_s)


def bucket_pipeline(ready_s: Sequence[float], comm_s: Sequence[float], *,
                    overlap: bool = True) -> list[tuple[float, float]]:
    """Start and end of each bucket's all-reduce on one stream, in launch order.

    Args:
        ready_s: when each bucket became ready (s from backward start), in launch order.
        comm_s: each bucket's all-reduce duration (s).
        overlap: False defers every all-reduce until the last bucket is ready (the engine's
            `overlap=false`).

    Returns:
        ``[(start_s, end_s)]``: start = max(ready, previous end), end = start + duration.
    """
    last_ready = max(ready_s, default=0.0)
    out, prev_end = [], 0.0
    for ready, dur in zip(ready_s, comm_s):
        start = max(ready if overlap else last_ready, prev_end)
        prev_end = start + dur
        out.append((start, prev_end))
    return out


def exposed_s(backward_s: float, spans: Sequence[tuple[float, float]]) -> float:
    """Communication left after backward's compute ends: max(0, last end − backward)."""
    return max(0.0, max((e for _, e in spans), default=0.0) - backward_s)


def ddp_step(*, forward_s: float, backward_s: float, optimizer_s: float, other_s: float,
             buckets: Sequence[tuple[int, float]], ready_frac: Sequence[float], n: int,
             comm: Callable[[float], float], overlap: bool = True) -> dict:
    """One DDP step at world size `n`.

    Args:
        forward_s, backward_s, optimizer_s, other_s: the rank's compute and host time (s).
        buckets: ``(bucket_index, nbytes)`` in launch order.
        ready_frac: each bucket's ready time as a fraction of `backward_s`.
        comm: all-reduce duration of a bucket of `nbytes` (s), e.g. `ring_allreduce_s` bound.

    Returns:
        ``{step_time_s, forward_s, backward_s, comm_exposed_s, optimizer_s, other_s, buckets}``
        with ``buckets = [{bucket_index, nbytes, ready_s, comm_start_s, comm_end_s}]``.
    """
    ready = [f * backward_s for f in ready_frac]
    spans = bucket_pipeline(ready, [comm(b) for _, b in buckets], overlap=overlap)
    exp = exposed_s(backward_s, spans)
    rows = [dict(bucket_index=i, nbytes=b, ready_s=r, comm_start_s=s, comm_end_s=e)
            for (i, b), r, (s, e) in zip(buckets, ready, spans)]
    return dict(step_time_s=forward_s + backward_s + exp + optimizer_s + other_s,
                forward_s=forward_s, backward_s=backward_s, comm_exposed_s=exp,
                optimizer_s=optimizer_s, other_s=other_s, buckets=rows)


def hub_copies_s(n: int, nbytes: float, alpha_s: float, beta_bytes_per_s: float,
                 overhead_s: float = 0.0) -> float:
    """n−1 copies of `nbytes` through device 0's link, one after another, each paying the link
    latency, the bytes at β and a per-device host overhead: (n−1)·(o + α + nbytes/β) (s)."""
    return max(0, n - 1) * (overhead_s + alpha_s + nbytes / beta_bytes_per_s)


def pipelined_copies_s(n: int, nbytes: float, alpha_s: float, beta_bytes_per_s: float,
                       overhead_s: float = 0.0) -> float:
    """NCCL's broadcast or reduce along a chain of n devices, pipelined in chunks: device 0 sends
    (or receives) the buffer once, so for large buffers the time tends to nbytes/β; each hop adds
    its latency and each device its host overhead: (n−1)·(o + α) + nbytes/β (s), 0 for n = 1."""
    if n <= 1:
        return 0.0
    return (n - 1) * (overhead_s + alpha_s) + nbytes / beta_bytes_per_s


def dp_step(*, n: int, phases: dict[str, float]) -> dict:
    """One DP step: the phases run one after another on device 0's thread, so the step is their
    sum. `phases` maps broadcast, scatter, forward, gather, loss, backward, reduce, optimizer and
    other (the Python between phases) to seconds.

    Returns:
        ``{step_time_s, phases, comm_s}`` (comm_s: the four copy phases).
    """
    comm = sum(phases.get(p, 0.0) for p in ("broadcast", "scatter", "gather", "reduce"))
    return dict(step_time_s=sum(phases.values()), phases=dict(phases), comm_s=comm, world_size=n)


def cpu_threads(n: int, cores: int) -> int:
    """Intra-op threads of one virtual CPU device at world size n (engine.components.training)."""
    return max(1, cores // n)


def time_share(n: int, cores: int) -> float:
    """k(n) = max(1, n·t(n)/cores): how many times slower a CPU device runs when the host's
    threads outnumber its cores."""
    return max(1.0, n * cpu_threads(n, cores) / cores)
