"""A standalone all-reduce probe on a run's own process group, in the style of nccl-tests.

nccl-tests' `all_reduce_perf` (github.com/NVIDIA/nccl-tests, src/common.cu `BenchTime`, and
doc/PERFORMANCE.md) times all-reduces of growing message sizes and reports, per size, the time,
algbw = bytes / time and busbw = algbw · 2(n−1)/n. This probe does the same on the run's process
group after the last training step, so the link's latency and bandwidth are measured with one
collective in flight, apart from training:

- sizes: first the run's own bucket sizes (`run_nbytes`, at most MAX_RUN_SIZES of them, agreed by
  the ranks), so every bucket the run all-reduced has a probe point of its size to be compared
  with; then float32 tensors of `min_bytes` × factor^i up to `max_bytes` (default 4 KiB .. 64 MiB, ×2);
- pilot and budget: each size, small to large, is piloted with PILOT_CALLS barrier + all-reduce
  calls whose median P estimates a call's cost (one scheduling hiccup on a busy host does not
  move a median). The ranks agree (an all-reduce with MAX) on P and on the time spent so far;
  size s is kept while spent + (w + k) · Σ(P of the kept sizes and s) ≤ `budget_s`. Before
  piloting s, the previous P scaled by s/s_prev is checked the same way (time grows at most in
  proportion to bytes in the ring model t = a + c·bytes, so that bounds it from above), and s is
  not even piloted when it would not fit. The run's bucket sizes and the smallest MIN_SIZES
  sizes of the ladder always run (the comparison and enough for a fit); the ladder sizes trimmed
  (always the largest) are listed in `skipped_nbytes`. After a run the budget is a tenth of
  the training loop's time, from 0.25 s up to the 2 s of `ddpviz probe` (`run_budget_s`).
- rounds: `warmup_iters` untimed rounds, then `iters` timed rounds; each round all-reduces every
  kept size once, in size order. Before each all-reduce every rank passes a barrier, so ranks
  start together and only that all-reduce is in flight (gloo would otherwise run up to two at
  once: ProcessGroupGloo's 2 worker threads). Each is timed alone: on CPU with the host clock
  around the blocking `dist.all_reduce`; on CUDA with CUDA events recorded on the current stream
  before and after it (`work.wait()` joins the collective's stream to the current one), after a
  `torch.cuda.synchronize` following the barrier. Rounds rather than one size after another:
  a scheduling burst on a busy host (tens of ms) then spoils one sample of a few sizes, not
  every sample of one size.
- time per size = the median of its `iters` times on each rank, then the maximum over ranks (an
  all-reduce with MAX): the all-reduce is done when the slowest rank has it. nccl-tests instead
  launches its iterations back to back on one stream and averages over ranks.

`probe_local` runs the probe alone on `world_size` local gloo processes (`ddpviz probe`).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ddpviz.engine.analysis import probe_fit, probe_no_fit_reason, probe_point  # noqa: F401  (pure: re-exported here)
from ddpviz.engine.measure.telemetry import now
from ddpviz.engine.modes.ranks import join_process_group, leave_process_group, start_rank_processes

PROBE_MIN_BYTES = 4 * 1024  # smallest message, bytes (nccl-tests' -b)
PROBE_MAX_BYTES = 64 * 1024 * 1024  # largest message, bytes (-e), if the budget allows
PROBE_SIZE_FACTOR = 2  # each size is the previous × this (-f)
PROBE_ITERS = 10  # timed all-reduces per size (k; nccl-tests' -n)
PROBE_WARMUP_ITERS = 3  # untimed rounds (each size once) before the timed ones (w; -w)
PROBE_BUDGET_S = 2.0  # seconds the probe may take; larger sizes are skipped past it
PILOT_CALLS = 3  # calls per size in the pilot that sizes the budget (their median)
PROBE_RUN_SHARE = 0.1  # after a run: the budget is this share of the run's training time ...
PROBE_MIN_BUDGET_S = 0.25  # ... but never below this (and never above PROBE_BUDGET_S)
MIN_SIZES = 3  # the smallest sizes always run, whatever the budget: enough for a fit
MAX_RUN_SIZES = 8  # distinct bucket sizes of the run probed first (spread over them when more)
PROBE_SOURCE = ("measured: standalone all-reduce on the run's process group after training, "
                "one collective in flight, median of k (max over ranks)")
_ELEMENT_BYTES = 4  # float32


def probe_sizes(min_bytes: int = PROBE_MIN_BYTES, max_bytes: int = PROBE_MAX_BYTES,
                factor: int = PROBE_SIZE_FACTOR) -> list[int]:
    """Message sizes in bytes: min_bytes · factor^i ≤ max_bytes, ascending.

    Raises:
        ValueError: min_bytes not a positive multiple of 4 (float32 elements), max_bytes below
            min_bytes, or factor < 2 — each naming the argument.
    """
    if min_bytes < _ELEMENT_BYTES or min_bytes % _ELEMENT_BYTES:
        raise ValueError(f"min_bytes must be a positive multiple of {_ELEMENT_BYTES} (float32) (got {min_bytes})")
    if max_bytes < min_bytes:
        raise ValueError(f"max_bytes must be >= min_bytes ({min_bytes}) (got {max_bytes})")
    if factor < 2:
        raise ValueError(f"factor must be >= 2 (got {factor})")
    sizes, n = [], min_bytes
    while n <= max_bytes:
        sizes.append(n)
        n *= factor
    return sizes


def run_sizes(nbytes: list[int], limit: int = MAX_RUN_SIZES) -> list[int]:
    """The run's bucket sizes to probe: distinct, rounded up to whole float32 elements, ascending;
    at most `limit`, spread evenly over the sorted sizes (the smallest and largest kept)."""
    sizes = sorted({-(-int(n) // _ELEMENT_BYTES) * _ELEMENT_BYTES for n in nbytes if int(n) > 0})
    if len(sizes) <= limit:
        return sizes
    return sorted({sizes[round(i * (len(sizes) - 1) / (limit - 1))] for i in range(limit)})


def check_probe_args(min_bytes: int = PROBE_MIN_BYTES, max_bytes: int = PROBE_MAX_BYTES,
                     factor: int = PROBE_SIZE_FACTOR, iters: int = PROBE_ITERS,
                     warmup_iters: int = PROBE_WARMUP_ITERS, budget_s: float = PROBE_BUDGET_S) -> list[int]:
    """The probe's sizes (`probe_sizes`) once every argument is checked.

    Raises:
        ValueError: naming the argument: bad sizes, iters < 1, warmup_iters < 0, budget_s <= 0.
    """
    if iters < 1:
        raise ValueError(f"iters must be >= 1 (got {iters})")
    if warmup_iters < 0:
        raise ValueError(f"warmup_iters must be >= 0 (got {warmup_iters})")
    if not budget_s > 0:
        raise ValueError(f"budget_s must be > 0 (got {budget_s})")
    return probe_sizes(min_bytes, max_bytes, factor)


def _is_nccl(group) -> bool:
    return dist.get_backend(group) == "nccl"


def _barrier(group, device: torch.device) -> None:
    if _is_nccl(group):
        dist.barrier(group, device_ids=[device.index])
    else:
        dist.barrier(group)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_one(buf: torch.Tensor, group, device: torch.device) -> float:
    """Seconds one blocking all-reduce of `buf` takes on this rank (CUDA events on CUDA)."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dist.all_reduce(buf, group=group)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3  # elapsed_time is in ms
    t0 = now()
    dist.all_reduce(buf, group=group)
    return now() - t0


def _agree_max(values: list[float], group, device: torch.device) -> list[float]:
    """The element-wise maximum over ranks (one all-reduce with MAX, float64)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.tolist()


def _pilot_s(buf: torch.Tensor, group, device: torch.device) -> float:
    """Median seconds of PILOT_CALLS barrier + all-reduce calls on this rank: a loop's cost per
    call, robust to one scheduling hiccup."""
    times = []
    for _ in range(PILOT_CALLS):
        t0 = now()
        _barrier(group, device)
        _time_one(buf, group, device)
        times.append(now() - t0)
    return statistics.median(times)


def _agree_sizes(sizes: list[int], group, device: torch.device) -> list[int]:
    """The same list on every rank: element-wise MAX of each rank's `sizes` padded to
    MAX_RUN_SIZES (DDP's bucket layout is the same on every rank, so this is each rank's list)."""
    padded = (sizes + [0] * MAX_RUN_SIZES)[:MAX_RUN_SIZES]
    return sorted({int(v) for v in _agree_max([float(v) for v in padded], group, device) if v > 0})


def _choose_sizes(first: list[int], sizes: list[int], group, device: torch.device, calls: int,
                  budget_s: float) -> tuple[list[torch.Tensor], list[int]]:
    """Pilot the run's sizes `first`, then each ladder size (ascending), and keep those that fit
    the budget (see the module docstring); `first` and the first `MIN_SIZES` of the ladder always
    run. Returns (a buffer per kept size, the skipped ladder sizes)."""
    bufs: list[torch.Tensor] = []
    pilots: dict[int, float] = {}
    t0, spent = now(), 0.0
    ladder = [s for s in sizes if s not in set(first)]
    order = [(n, True) for n in first] + [(n, i < MIN_SIZES) for i, n in enumerate(ladder)]
    for i, (nbytes, must) in enumerate(order):
        below = [s for s in pilots if s <= nbytes]
        if below and not must:
            guess = pilots[max(below)] * nbytes / max(below)  # ≥ the pilot to come (time ∝ bytes at most)
            if spent + PILOT_CALLS * guess + calls * (sum(pilots.values()) + guess) > budget_s:
                return bufs, [n for n, _ in order[i:]]
        buf = torch.zeros(nbytes // _ELEMENT_BYTES, dtype=torch.float32, device=device)  # 0+0 stays finite
        pilot, spent = _agree_max([_pilot_s(buf, group, device), now() - t0], group, device)
        if not must and spent + calls * (sum(pilots.values()) + pilot) > budget_s:
            return bufs, [n for n, _ in order[i:]]
        bufs.append(buf)
        pilots[nbytes] = pilot
    return bufs, []


def run_budget_s(train_s: float, cap_s: float = PROBE_BUDGET_S) -> float:
    """The probe's budget (s) after a run whose training loop took `train_s` wall seconds:
    PROBE_RUN_SHARE of it, within [PROBE_MIN_BUDGET_S, cap_s].

    Why: at the full 2 s budget the probe of a 4-step smoke run (0.3 s of training on 2 CPU
    ranks) took six times the training it follows; a run of 20 s or more gets the whole budget.
    The run's own bucket sizes and the smallest MIN_SIZES ladder sizes run whatever the budget.
    """
    return min(cap_s, max(PROBE_MIN_BUDGET_S, PROBE_RUN_SHARE * max(0.0, train_s)))


def run_probe(group=None, device: torch.device | str = "cpu", *, min_bytes: int = PROBE_MIN_BYTES,
              max_bytes: int = PROBE_MAX_BYTES, factor: int = PROBE_SIZE_FACTOR,
              iters: int = PROBE_ITERS, warmup_iters: int = PROBE_WARMUP_ITERS,
              budget_s: float = PROBE_BUDGET_S, run_nbytes: list[int] | None = None) -> dict[str, Any]:
    """Time all-reduces of each size on `group` (see the module docstring for the method);
    `run_nbytes`: the run's bucket sizes, probed first (`run_sizes`).

    A collective: every rank of `group` must call it with the same arguments (but `budget_s`:
    the ranks take the largest one), with nothing else in flight on the group. `device` holds
    the tensors (the rank's CUDA device under NCCL).

    Returns ``{points: [probe_point...] (ascending size), skipped_nbytes: [...], run_nbytes (the
    run's sizes probed), wall_s, iters, warmup_iters, world_size, budget_s}``; identical on every
    rank (times and the run's sizes are agreed by a MAX all-reduce).

    Raises:
        ValueError: a bad argument (`check_probe_args`).
    """
    sizes = check_probe_args(min_bytes, max_bytes, factor, iters, warmup_iters, budget_s)
    device = torch.device(device)
    world = dist.get_world_size(group)
    t0 = now()
    first = _agree_sizes(run_sizes(run_nbytes or []), group, device)
    (budget_s,) = _agree_max([budget_s], group, device)  # the size choice must be the same everywhere
    bufs, skipped = _choose_sizes(first, sizes, group, device, warmup_iters + iters, budget_s)
    bufs.sort(key=lambda b: b.numel())  # rounds all-reduce every kept size in size order
    times: list[list[float]] = [[] for _ in bufs]
    for r in range(warmup_iters + iters):
        for buf, ts in zip(bufs, times):
            _barrier(group, device)
            t = _time_one(buf, group, device)
            if r >= warmup_iters:
                ts.append(t)
    *medians, wall_s = _agree_max([statistics.median(ts) for ts in times] + [now() - t0], group, device)
    points = [probe_point(b.numel() * _ELEMENT_BYTES, t, world) for b, t in zip(bufs, medians)]
    return dict(points=points, skipped_nbytes=sorted(skipped), run_nbytes=first, wall_s=wall_s, iters=iters,
                warmup_iters=warmup_iters, world_size=world, budget_s=budget_s)


def probe_event_fields(result: dict[str, Any], backend: str) -> dict[str, Any]:
    """The `allreduce_probe` event's fields (docs/events.md) from a `run_probe` result; `fit_note`
    says why `fit` is None and what to do (`probe_no_fit_reason`), None when there is a fit."""
    fit = probe_fit(result["points"], result["world_size"])
    return dict(backend=backend, world_size=result["world_size"], dtype="float32",
                iters=result["iters"], warmup_iters=result["warmup_iters"], points=result["points"],
                fit=fit, fit_note=None if fit else probe_no_fit_reason(result["points"]), source=PROBE_SOURCE,
                skipped_nbytes=result["skipped_nbytes"], run_nbytes=result["run_nbytes"],
                budget_s=result["budget_s"],
                wall_s=result["wall_s"])


def emit_probe(tel, device: torch.device, group=None, **kwargs: Any) -> dict[str, Any]:
    """Run the probe on every rank of `group`; rank 0 emits one `allreduce_probe` event through
    `tel` (an `engine.measure.telemetry.Telemetry`). Returns the event's fields. `kwargs` go to `run_probe`."""
    result = run_probe(group, device, **kwargs)
    fields = probe_event_fields(result, dist.get_backend(group))
    if dist.get_rank(group) == 0:
        tel.emit("allreduce_probe", **fields)
    return fields


# -- the probe alone, on local gloo processes (`ddpviz probe`) --------------------------------

def _local_rank_main(rank: int, world_size: int, port: int, out: str, kwargs: dict[str, Any]) -> None:
    from datetime import timedelta

    from ddpviz.engine.components.training import cpu_threads_per_rank
    from ddpviz.engine.events import ListSink
    from ddpviz.engine.measure.telemetry import Telemetry

    torch.set_num_threads(cpu_threads_per_rank(world_size))
    join_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=60))
    try:
        sink = ListSink()
        emit_probe(Telemetry(sink, "probe", rank=rank, device=f"cpu:{rank}"), torch.device("cpu"), **kwargs)
        if rank == 0:
            Path(out).write_text(json.dumps(sink.events[0]))
    finally:
        leave_process_group()


def probe_local(world_size: int = 2, **kwargs: Any) -> dict[str, Any]:
    """Run only the probe on `world_size` local CPU processes over gloo (loopback TCP).

    Returns rank 0's `allreduce_probe` event (run_id "probe"). `kwargs` go to `run_probe`.

    Raises:
        ValueError: world_size < 2 (an all-reduce needs two ranks to move bytes), or a bad
            argument (`check_probe_args`), before any process starts.
    """
    if world_size < 2:
        raise ValueError(f"world_size must be >= 2 (got {world_size})")
    check_probe_args(**{k: v for k, v in kwargs.items() if k != "run_nbytes"})  # refused before any process starts
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="ddpviz-probe-") as tmp:
        out = os.path.join(tmp, "probe.json")
        start_rank_processes(_local_rank_main, (world_size, port, out, kwargs), world_size)
        return json.loads(Path(out).read_text())
