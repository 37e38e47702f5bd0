"""Bucket records with no Python per bucket: DDP's own C++ all-reduce, read back from DDP's reducer
and, on an attached NCCL run's sampled steps, from PyTorch's flight recorder (issue 31).

A Python comm hook costs ~500 µs per bucket per step on 2 gloo ranks of this 2-core machine and
50-75 µs on an H200 (issue 31), PyTorch's own `allreduce_hook` as much; DDP with no hook costs
nothing extra. A DDP takes one comm hook for its life (`Reducer::register_comm_hook`: "can only be
called once"), so the choice is made per run, not per step (`no_hook_path`). With no hook,
DDP's reducer divides each gradient by world_size while copying it into its bucket and all-reduces
the bucket (sum) in C++, in bucket-index order (`Reducer::mark_bucket_ready`).

Every step (`engine.modes.ddp.reducer.LayoutBuckets`): the reducer's layout and its own stamps. A launched
run never turns the flight recorder on.

The flight recorder (`FlightReader`, `FlightBuckets`; `ddpviz run` turns it on for NCCL scripts,
`engine.attach.env`, read on sampled steps only, `engine.attach.nohook`): every collective is
recorded when its buffer is non-zero (`TORCH_FR_BUFFER_SIZE`, or `TORCH_NCCL_TRACE_BUFFER_SIZE` on
older NCCL builds; torch 2.13 reads it when the process group is made), and
`torch._C._distributed_c10d._dump_nccl_trace()` / `_dump_fr_trace()` (`dump_function`) returns a
pickle of its entries. What an entry holds depends on the version and backend, checked per entry:

- `time_created_ns` (unix ns, host clock): when the reducer handed the bucket to the backend — the
  bucket's all-reduce enqueue time, every version and backend seen (gloo 2.13, NCCL 2.11);
- `input_sizes` / `input_dtypes`: the bucket's element count and dtype, so its bytes;
- `duration_ms`: GPU time of the collective, NCCL with `TORCH_NCCL_ENABLE_TIMING=1` only, set when
  NCCL's watchdog retires the work (`FlightRecorder::retire_id`, a loop of ~100 ms), so a read soon
  after the step may find none yet; gloo (2.13) gives none.

Enqueue and duration are kept apart (`enqueue_s`, `comm_duration_s`): the GPU starts a collective
later than its host enqueue, so they make no span (`comm_start_s`/`comm_end_s` null). `ready_s` is
not measured there. A dump with its unpickling costs 11.4-12.6 µs per entry the buffer holds on an
H100 host (docs/gpu/2026-12-05-h100/flight_cost.json; ~5-6 µs here on gloo): read rarely, small.
"""

from __future__ import annotations

import os
import pickle
import time
from typing import Any, Callable

FR_BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"
NCCL_BUFFER_ENV = "TORCH_NCCL_TRACE_BUFFER_SIZE"  # the older name (torch <= 2.5 NCCL builds)
NCCL_TIMING_ENV = "TORCH_NCCL_ENABLE_TIMING"  # NCCL: record CUDA events per collective, so duration_ms
SLACK_ENTRIES = 16  # the replica check's all-gather and anything else between two reads
DTYPE_BYTES = {"Float": 4, "Half": 2, "BFloat16": 2, "Double": 8, "Long": 8, "Int": 4, "Byte": 1, "Char": 1,
               "Bool": 1, "Short": 2}
SOURCE = "flight recorder"  # the `bucket` events' `source` on this path (+ what it measured)


def no_hook_path(cfg: Any, backend: str, model: Any) -> bool:
    """Whether this rank's DDP runs with no comm hook (`effective_bucket_timing` "recorder": "auto" on gloo; overlap
    on, no compression hook, no sparse gradient). Its buckets then come from DDP's reducer
    (`engine.modes.ddp.reducer.LayoutBuckets`),
    on every backend; the flight recorder is not turned on (on NCCL it was read every step: 11.4-12.6 µs
    per entry held, ~0.55 ms a step at 15 buckets on an H100 host, most of that path's 1.030-1.048x over
    plain DDP, docs/gpu/2026-12-05-h100). On gloo the recorder would also gather each entry's Python stack
    under the GIL: 1.9 ms per bucket on 2 gloo ranks here (torch 2.13, 48 buckets; the Python hook 0.6 ms,
    no hook ~0: docs/bench/bucket-cost-cpu-2core.json)."""
    from ddpviz.engine.config import effective_bucket_timing

    if effective_bucket_timing(cfg, backend) != "recorder" or not cfg.overlap or cfg.comm_hook != "none":
        return False
    from ddpviz.engine.modes.ddp.buckets import expect_sparse_gradient

    # the layout's sizes are dense; what a sparse bucket sends (values and indices,
    # `Reducer::mark_variable_ready_sparse`) only the hook sees
    return not any(expect_sparse_gradient(model))


def buffer_entries(expected_buckets: int) -> int:
    """Flight-recorder entries to keep: two steps' buckets plus `SLACK_ENTRIES` (a read after a sampled
    step then finds all its buckets, and costs in proportion to one step's buckets)."""
    return 2 * max(1, expected_buckets) + SLACK_ENTRIES


def buffer_env_names(torch_version: str | None) -> tuple[str, ...]:
    """The buffer variable(s) to set for a torch of `torch_version` ("2.13.0+cpu"; None: unknown). Torch 2.9
    renamed `TORCH_NCCL_TRACE_BUFFER_SIZE` to `TORCH_FR_BUFFER_SIZE`, keeping the old name as an alias that
    warns on every rank when set ("Environment variable TORCH_NCCL_TRACE_BUFFER_SIZE is deprecated", seen in an
    attached script's output on torch 2.13): the new name from 2.9, the old one before, both where unknown."""
    try:
        major, minor = (int(x) for x in (torch_version or "").split("+")[0].split(".")[:2])
    except ValueError:
        return FR_BUFFER_ENV, NCCL_BUFFER_ENV
    return (FR_BUFFER_ENV,) if (major, minor) >= (2, 9) else (NCCL_BUFFER_ENV,)


def installed_torch_version() -> str | None:
    """The installed torch's version from its package metadata (no torch import), or None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return None


def enable_recorder(entries: int, backend: str, environ: dict[str, str] | None = None,
                    torch_version: str | None = None) -> int:
    """Turn the flight recorder on for this process (before its first collective); returns the
    buffer size in force. A size the user already set is kept; the variable set is the one the torch of
    `torch_version` reads (`buffer_env_names`; default: the installed torch's). On NCCL,
    `TORCH_NCCL_ENABLE_TIMING` is set to 1 unless set, so entries carry `duration_ms`."""
    env = os.environ if environ is None else environ
    given = env.get(FR_BUFFER_ENV) or env.get(NCCL_BUFFER_ENV)
    if not given:
        for name in buffer_env_names(torch_version or installed_torch_version()):
            env[name] = str(entries)
    if backend == "nccl":
        env.setdefault(NCCL_TIMING_ENV, "1")
    return int(given or entries)


def dump_function(backend: str = "gloo") -> Callable[..., bytes] | None:
    """PyTorch's dump of the flight recorder that holds `backend`'s collectives, for this version (None
    where there is none). NCCL's entries are in a recorder of their own (`FlightRecorder<CUDAEvent>`,
    dumped by `_dump_nccl_trace`); `_dump_fr_trace` dumps the generic one, which holds gloo's. On the
    H100 (torch 2.11, NCCL 2.28.9) `_dump_fr_trace` returned no entry after 1,024 NCCL all-reduces
    (docs/gpu/2026-12-05-h100/flight_cost.json), so on NCCL `_dump_nccl_trace` comes first."""
    try:
        import torch._C._distributed_c10d as c10d
    except ImportError:
        return None
    order = ("_dump_nccl_trace", "_dump_fr_trace") if backend == "nccl" else ("_dump_fr_trace", "_dump_nccl_trace")
    return next((f for f in (getattr(c10d, name, None) for name in order) if f is not None), None)


def entry_nbytes(entry: dict[str, Any]) -> int | None:
    """Bytes of an entry's inputs (`input_sizes` x `input_dtypes`); None if a dtype is unknown."""
    total = 0
    for shape, dtype in zip(entry.get("input_sizes") or [], entry.get("input_dtypes") or []):
        size = DTYPE_BYTES.get(dtype)
        if size is None:
            return None
        n = 1
        for d in shape:
            n *= d
        total += n * size
    return total


class FlightReader:
    """Reads the entries the flight recorder added since the last read.

    Args:
        dump: the dump function (`dump_function(backend)`); a stand-in in tests.
        backend: whose collectives to read ("nccl" or "gloo": `dump_function`), when `dump` is not given.
    Raises:
        RuntimeError: this torch has no flight-recorder dump.
    """

    def __init__(self, dump: Callable[..., bytes] | None = None, backend: str = "gloo"):
        self.dump = dump or dump_function(backend)
        if self.dump is None:
            raise RuntimeError("this torch has no flight recorder dump (_dump_fr_trace / _dump_nccl_trace)")
        self.last_record_id = -1
        self.dropped = 0  # entries overwritten before a read (the buffer wrapped)

    def read(self) -> list[dict[str, Any]]:
        """New entries, oldest first (by `record_id`)."""
        try:
            raw = self.dump(includeCollectives=True, includeStackTraces=False, onlyActive=False)
        except TypeError:  # a version without these keywords
            raw = self.dump()
        entries = sorted(pickle.loads(raw).get("entries", []), key=lambda e: e.get("record_id", -1))
        new = [e for e in entries if e.get("record_id", -1) > self.last_record_id]
        if new:
            if self.last_record_id >= 0:
                self.dropped += max(0, new[0]["record_id"] - self.last_record_id - 1)
            self.last_record_id = new[-1]["record_id"]
        return new


def _is_allreduce(entry: dict[str, Any]) -> bool:
    return str(entry.get("profiling_name", "")).endswith("all_reduce")


class FlightBuckets:
    """One rank's bucket records from the flight recorder, per synced backward.

    Args:
        reader: a `FlightReader`.
        layout: `() -> [(param_indices or None, nbytes), ...]` in bucket-index order (DDP's current
            layout, `engine.modes.ddp.reducer.reducer_layout`), or None.
        names: trainable parameter names in DDP's parameter order (the indices' meaning).
    """

    def __init__(self, reader: FlightReader, layout: Callable[[], list[tuple[Any, int]] | None],
                 names: list[str] | None = None):
        self.reader, self._layout_fn, self.names = reader, layout, names or []
        self.origin_ns = 0
        self._layout: list[tuple[Any, int]] | None = None  # kept once rebuilt (DDP rebuilds once)
        self._named: Any = None  # the layout whose parameter names were last emitted

    def layout(self) -> list[tuple[Any, int]]:
        if self._layout is not None:
            return self._layout
        got = self._layout_fn() or []
        if got and all(ix is not None for ix, _ in got):
            self._layout = got
        return got

    def begin_backward(self) -> None:
        """Call right before the backward whose buckets should be recorded."""
        self.origin_ns = time.time_ns()  # entries created before it (broadcasts, checks) are left out

    def resolved(self) -> list[dict[str, Any]]:
        """This backward's buckets (call after it): `bucket_index` (launch order = index order),
        `nbytes` (from the entry), `num_params` and, when the layout is new, `param_names` (DDP's
        layout, used only where its bucket count and bytes match the entries), `enqueue_s` (host,
        seconds from the backward's start), `comm_duration_s` (GPU, `duration_ms` where the recorder
        has it, else None), `ready_s`, `comm_start_s`, `comm_end_s` None (`_record`), `source`,
        `sampled` False."""
        mine = [e for e in self.reader.read() if self.origin_ns <= e.get("time_created_ns", 0)]
        entries = [e for e in mine if _is_allreduce(e)]
        out = [self._record(i, e, len(entries), self.origin_ns) for i, e in enumerate(entries)]
        layout = self.layout()
        if [b for _, b in layout] == [r["nbytes"] for r in out]:
            fresh = self._named != layout
            for r, (ix, _) in zip(out, layout):
                r["num_params"] = len(ix) if ix is not None else None
                if fresh and ix is not None and self.names:
                    r["param_names"] = [self.names[i] if i < len(self.names) else "?" for i in ix]
            self._named = layout if fresh and all(ix is not None for ix, _ in layout) else self._named
        return out

    def _record(self, i: int, e: dict[str, Any], n: int, origin_ns: int) -> dict[str, Any]:
        """One bucket's fields from its entry: the host enqueue and, where NCCL measured it, the GPU
        duration, each in a field of its own. Not a span: the GPU starts the collective when its stream
        reaches it, later than the enqueue by however far the host ran ahead, so enqueue + duration
        would place the all-reduce where it did not run (`comm_start_s`/`comm_end_s` null)."""
        dur_ms = e.get("duration_ms")
        measured = "bytes, host enqueue time" + (
            " and GPU duration (NCCL's CUDA events); the GPU's start and end not measured" if dur_ms is not None
            else "; all-reduce start, end and duration not measured (none recorded yet on this backend)")
        return dict(bucket_index=i, nbytes=entry_nbytes(e), num_params=None, is_last=i == n - 1, ready_s=None,
                    comm_start_s=None, comm_end_s=None, enqueue_s=(e["time_created_ns"] - origin_ns) / 1e9,
                    comm_duration_s=dur_ms / 1e3 if dur_ms is not None else None, sampled=False,
                    source=f"{SOURCE}: {measured}")


def recorder_on(environ: dict[str, str] | None = None) -> bool:
    """Whether this process's flight recorder has a buffer (and this torch a dump)."""
    env = os.environ if environ is None else environ
    size = env.get(FR_BUFFER_ENV) or env.get(NCCL_BUFFER_ENV) or "0"
    return size.isdigit() and int(size) > 0 and dump_function() is not None
