"""What reading PyTorch's flight recorder costs, per entry it holds (issue 31): the figures that decide
how often ddpviz's recorder path may read it, and on which thread.

`flight_cost()` makes a one-rank process group (NCCL on CUDA, gloo on CPU) with the recorder on
(`engine.modes.ddp.flight.enable_recorder`), issues all-reduces until the buffer holds each of
`HELD` entries, and times, on this thread (`time.perf_counter_ns`, median of `REPEATS`):

- the dump (`_dump_fr_trace` / `_dump_nccl_trace`) without and with stack traces;
- unpickling it (`pickle.loads`);
- how much of a dump leaves the GIL free: a second Python thread counts loop turns while this one
  dumps, against its count while this one sleeps for as long (1.0: the dump holds no GIL, so a reader
  thread would cost the training thread nothing while dumping; 0.0: it holds the GIL throughout).

It also says which fields the entries carry on this version and backend (e.g. `duration_ms` is NCCL
with `TORCH_NCCL_ENABLE_TIMING=1` only).
Run: `python -m ddpviz.engine.harness.flight_cost [OUT.json] [--held 16,64]` (default held: `HELD`).
"""

from __future__ import annotations

import json
import os
import pickle
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

HELD = (16, 64, 256, 1024)  # entries the buffer holds when read
BUFFER = 2048  # larger than every HELD, so none wraps
REPEATS = 7
GIL_WINDOW_S = 0.3


def _median_ns(fn, repeats: int = REPEATS) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times)


def gil_free_fraction(work, window_s: float = GIL_WINDOW_S) -> float:
    """How far a counting thread keeps its pace while `work()` runs in a loop on this thread for
    `window_s`, against its pace while this thread sleeps as long (1.0: `work` holds no GIL)."""
    count = [0]
    stop = threading.Event()

    def counter() -> None:
        while not stop.is_set():
            count[0] += 1

    t = threading.Thread(target=counter, daemon=True)
    t.start()
    try:
        time.sleep(0.05)
        c0 = count[0]
        time.sleep(window_s)
        idle = count[0] - c0
        c0, t0 = count[0], time.perf_counter()
        while time.perf_counter() - t0 < window_s:
            work()
        busy = count[0] - c0
    finally:
        stop.set()
        t.join()
    return busy / idle if idle else float("nan")


def flight_cost(held: tuple[int, ...] = HELD) -> dict[str, Any]:
    """The figures of the module docstring, JSON-able: ``backend``, ``torch``, ``rows`` (per held
    count: ``entries`` read back, ``dump_ms``, ``dump_stack_ms``, ``loads_ms``, ``us_per_entry``
    (dump + loads, no stacks), ``gil_free``), ``entry_keys``, ``duration_ms_present``, ``source``.

    Raises:
        RuntimeError: this torch has no flight-recorder dump.
    """
    import torch
    import torch.distributed as dist

    from ddpviz.engine.modes.ddp.flight import dump_function, enable_recorder

    cuda = torch.cuda.is_available()
    backend = "nccl" if cuda else "gloo"
    enable_recorder(BUFFER, backend)
    dump = dump_function(backend)
    if dump is None:
        raise RuntimeError("this torch has no flight recorder dump (_dump_fr_trace / _dump_nccl_trace)")
    device = torch.device("cuda:0" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    with tempfile.TemporaryDirectory(prefix="ddpviz-frcost-") as tmp:
        dist.init_process_group(backend, init_method=f"file://{tmp}/pg", rank=0, world_size=1)
        try:
            x = torch.ones(1024, device=device)
            issued, rows = 0, []

            def raw(stacks: bool = False) -> bytes:
                return dump(includeCollectives=True, includeStackTraces=stacks, onlyActive=False)

            last: dict[str, Any] = {}
            for n in held:
                while issued < n:
                    dist.all_reduce(x)
                    issued += 1
                if cuda:
                    torch.cuda.synchronize(device)
                time.sleep(0.3)  # NCCL's watchdog retires the works (and fills duration_ms) on its own thread
                blob = raw()
                entries = pickle.loads(blob).get("entries", [])
                last = entries[-1] if entries else {}
                dump_ns, stack_ns = _median_ns(raw), _median_ns(lambda: raw(True), 3)
                loads_ns = _median_ns(lambda: pickle.loads(blob))
                rows.append(dict(held=n, entries=len(entries), dump_ms=dump_ns / 1e6, dump_stack_ms=stack_ns / 1e6,
                                 loads_ms=loads_ns / 1e6, bytes=len(blob),
                                 us_per_entry=(dump_ns + loads_ns) / 1e3 / max(1, len(entries)),
                                 gil_free=gil_free_fraction(raw)))
        finally:
            dist.destroy_process_group()
    return dict(backend=backend, torch=torch.__version__, device=torch.cuda.get_device_name(0) if cuda else "cpu",
                rows=rows, entry_keys=sorted(last), duration_ms_present=last.get("duration_ms") is not None,
                source="measured: time.perf_counter_ns around the dump and pickle.loads on this thread, median of "
                       f"{REPEATS}; gil_free = a counting thread's pace during dumps / during a sleep")


if __name__ == "__main__":  # python -m ddpviz.engine.harness.flight_cost [OUT.json] [--held 16,64,...]
    args = sys.argv[1:]
    held = HELD
    if "--held" in args:
        i = args.index("--held")
        held = tuple(int(n) for n in args[i + 1].split(","))
        del args[i:i + 2]
    got = flight_cost(held)
    text = json.dumps(got, indent=1, default=str)
    if args:
        with open(args[0], "w") as f:
            f.write(text)
    print(text)
    os._exit(0)
