"""Bucket records with no Python per bucket: DDP's own C++ all-reduce, read back from DDP's reducer
and, on an attached NCCL run's sampled steps, from PyTorch's flight recorder (issue 31).

A Python comm hook costs ~500 µs per bucket per step on 2 gloo ranks of this 2-core machine and
50-75 µs on an H200 (issue 31), PyTorch's own `allreduce_hook` as much; DDP with no hook costs
nothing extra. A DDP takes one comm hook for its life (`Reducer::register_comm_hook`: "can only be
called once"), so the choice is made per run, not per step (`no_hook_path`). With no hook,
DDP's reducer divides each gradient by world_size while copying it into its bucket and all-reduces
the bucket (sum) in C++, in bucket-index order (`Reducer::mark_bucket_ready`).

Every step (`LayoutBuckets`): the reducer's layout (bytes, parameters, order) and its own stamp of
each gradient (`Reducer::get_backward_stats`, ~7 µs a read): on CPU the bucket's ready time, on CUDA
the host time its all-reduce was launched (`enqueue_s`); on gloo's sampled steps also PyTorch's
profiler (`engine.modes.ddp.sampled`). A launched run never turns the flight recorder on.

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
    on, no compression hook, no sparse gradient). Its buckets then come from DDP's reducer (`LayoutBuckets`),
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
            layout, `reducer_layout`), or None.
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


def reducer_layout(ddp: Any) -> list[tuple[tuple[int, ...] | None, int]] | None:
    """(parameter indices, nbytes) per bucket of `ddp`'s current layout, from DDP's logging data
    (`_get_ddp_logging_data()`: `rebuilt_per_bucket_param_indices` / `rebuilt_bucket_sizes` once the
    reducer rebuilt its buckets and logged it, else `bucket_sizes` with indices unknown); None if
    absent. Indices are into DDP's trainable parameters (module order, shared ones once)."""
    data = ddp._get_ddp_logging_data()
    rebuilt = data.get("rebuilt_bucket_sizes")
    sizes = rebuilt or data.get("bucket_sizes")
    if not sizes:
        return None
    nbytes = [int(s) for s in str(sizes).split(",")]
    groups = str(data.get("rebuilt_per_bucket_param_indices") or "").split(",")
    if rebuilt and len(groups) == len(nbytes):
        return [(tuple(int(i) for i in g.split()), b) for g, b in zip(groups, nbytes)]
    return [(None, b) for b in nbytes]


from ddpviz.engine.modes.ddp.sampled import PROFILER_SOURCE, UNPAIRED  # noqa: E402  (sampled steps' source)

LAYOUT_SOURCE = ("DDP's reducer layout: bytes, parameters and order measured; ready, all-reduce start and end "
                 "not measured (no comm hook, no flight recorder read)")
READY_SOURCE = ("DDP's reducer: bytes, parameters and order from its layout; ready = its own gradient-ready time "
                "of the bucket's last parameter (Reducer::get_backward_stats, C++, every step); all-reduce start "
                "and end not measured (no comm hook, no flight recorder read)")
READY_EXPOSED_SOURCE = "backward end minus the last gradient's ready time (DDP's reducer, Reducer::get_backward_stats)"
ENQUEUE_SOURCE = ("DDP's reducer: bytes, parameters and order from its layout; enqueue = the host time the "
                  "reducer launched the bucket's all-reduce (its last gradient's stamp, Reducer::get_backward_stats, "
                  "C++, every step, or an earlier bucket's launch if later: buckets launch in index order); CUDA "
                  "module: the GPU reaches the gradient and the all-reduce later, so ready, all-reduce start and end "
                  "are not measured (no comm hook, no recorder read)")


class LayoutBuckets:
    """One rank's bucket records from DDP's own reducer, no recorder: the buckets DDP
    all-reduced (`reducer._get_zeros_like_grad_buckets()`: the current layout's sizes and
    parameters, read on the first `LAYOUT_READS` backwards — DDP rebuilds once, in the second
    forward — then kept), all-reduce times null.

    Ready times on every step, from the reducer itself (CPU modules): DDP's reducer stamps each
    parameter's gradient as it marks it ready (`Reducer::mark_variable_ready`: `backward_stats_[i] =
    now - backward_compute_start_time_`, set in `prepare_for_backward` at the end of DDP's forward,
    every iteration; read by `reducer.get_backward_stats()`, ns, one list per step, ~7 µs here). A
    bucket's `ready_s` is its last parameter's (the bucket indices: DDP's logged rebuilt layout,
    `reducer_layout`). Their origin is taken when DDP's forward returned (`forward_returned`), just
    after `prepare_for_backward` stamped it, so a ready time is late by that gap (µs; the exposed
    comm derived from it is short by as much, never long).

    On CUDA modules the same stamps are host times: when the autograd engine ran the gradient's hook, which
    queued work the GPU runs later. There DDP launches a bucket's all-reduce right after the stamp of its last
    gradient (`Reducer::mark_variable_ready` -> `mark_bucket_ready`, buckets in index order), so the stamps
    give each bucket's launch (`enqueue_s`: the latest stamp of it and of every bucket before it), the host
    enqueue the NCCL flight recorder's `time_created_ns` also gives, without a dump per step (11.4-12.6 µs
    per entry held on an H100 host, docs/gpu/2026-12-05-h100/flight_cost.json); `ready_s` and the all-reduce
    times stay null (`ENQUEUE_SOURCE`), and no profiler runs on sampled steps (its spans are gloo's).

    Args:
        ddp: the `DistributedDataParallel`.
        names: parameter name by `data_ptr()`.
        host_enqueue: report the stamps as launch times (`enqueue_s`) instead of ready times; default:
            the DDP's module is on an accelerator (CUDA or any other non-CPU device).
    """

    LAYOUT_READS = 3
    # while the reducer's logged layout has no parameter indices yet, read again up to this pass: with
    # static_graph DDP logs its rebuilt layout after the 4th backward (torch 2.13, a new user's trial, 2026-12-06),
    # and before this the steps after the 3rd had no ready times; a read allocates a zero copy of every bucket
    LAYOUT_RETRIES = 8

    def __init__(self, ddp: Any, names: dict[int, str], host_enqueue: bool | None = None):
        from ddpviz.engine.modes.ddp.sampled import SampledSpans

        self.ddp, self.names, self.passes = ddp, names, 0
        self._layout: list[tuple[tuple[str, ...], int]] = []
        self._groups: list[tuple[int, ...]] | None = None  # reducer parameter indices per bucket
        self._named: Any = None
        self.sample_next = False  # set by the rank before a sampled step (its full spans: `SampledSpans`)
        self.sampler = SampledSpans()
        # any accelerator: its stamps are host times of work the device runs later
        self.host_enqueue = getattr(getattr(ddp, "device", None), "type", "cpu") != "cpu" \
            if host_enqueue is None else host_enqueue
        self._forward_ns: int | None = None  # when the latest synced forward returned
        self._origin_ns = 0  # the backward's start (`begin_backward`)

    @property
    def layout(self) -> list[tuple[tuple[str, ...], int]]:
        """The current buckets as (parameter names, bytes); a new list object whenever it was read anew."""
        return self._layout

    def held_nbytes(self, gradient_as_bucket_view: bool) -> int:
        """Bytes of the bucket buffers DDP's reducer holds in C++ (its layout's sizes, known after the
        first backward): no hook is handed them, so the memory ledger cannot see them on sight. 0 when
        the buffers are the gradients' own storage (`gradient_as_bucket_view`: counted as grads)."""
        if gradient_as_bucket_view:
            return 0
        if not self._layout:  # before the first backward: DDP's initial buckets (made in its constructor)
            self._read_layout()
        return sum(nbytes for _, nbytes in self._layout)

    def forward_returned(self) -> None:
        """Call right after a DDP forward that will all-reduce (grad mode on, outside `no_sync`)
        returned: the origin of the reducer's gradient-ready times (class docstring)."""
        self._forward_ns = time.perf_counter_ns()

    def begin_backward(self) -> None:
        """Call right before the backward whose buckets should be recorded."""
        self.passes += 1
        self._origin_ns = time.perf_counter_ns()
        self.sampler.stood_aside = None
        if self.sample_next and not self.host_enqueue:
            self.sampler.start()

    def taken(self) -> Callable[[], list[dict[str, Any]]]:
        """`resolved` of this backward, read now (its rows are host-side: the layout and, on CPU, the
        reducer's ready stamps, which the next backward overwrites), handed back later."""
        rows = self.resolved()
        return lambda: rows

    def resolved(self) -> list[dict[str, Any]]:
        """This backward's buckets: bucket_index, nbytes, num_params, param_names (when the layout
        is new), `ready_s` (CPU) or `enqueue_s` (CUDA, `host_enqueue`) where the reducer's stamps map to
        the layout, all-reduce times None except on a profiled gloo step, `source`, `sampled`."""
        if self._layout_due():
            self._read_layout()
        fresh = self._named != self._layout
        self._named = self._layout
        n = len(self._layout)
        profiled = self.sampler.active
        spans = self.sampler.spans() if profiled else None
        if profiled and (spans is None or len(spans) != n):  # claim nothing, and say why
            spans = None
            self.sampler.stood_aside = UNPAIRED.format(n=n)
        fwd, self._forward_ns = self._forward_ns, None  # one synced forward's origin, used once
        readies = None if spans or fwd is None else self._readies(fwd)
        if readies and self.host_enqueue:
            return [dict(self._row(i, (None, None, None), ENQUEUE_SOURCE, fresh), enqueue_s=t)
                    for i, t in enumerate(launches(readies))]
        source = PROFILER_SOURCE if spans else READY_SOURCE if readies else LAYOUT_SOURCE
        if self.sampler.stood_aside and not spans:  # a sampled step that could not be profiled: say why
            source += f"; this sampled step's all-reduce start and end not measured: {self.sampler.stood_aside}"
        return [self._row(i, spans[i] if spans else (readies[i] if readies else None, None, None), source, fresh)
                for i in range(n)]

    def _row(self, i: int, times: tuple, source: str, fresh: bool) -> dict[str, Any]:
        """Bucket `i`'s event fields with (ready, start, end) `times`."""
        params, nbytes = self._layout[i]
        ready, start, end = times
        return dict(bucket_index=i, nbytes=nbytes, num_params=len(params), is_last=i == len(self._layout) - 1,
                    ready_s=ready, comm_start_s=start, comm_end_s=end, sampled=source == PROFILER_SOURCE,
                    source=source, **(dict(param_names=list(params)) if fresh else {}))

    def steady_readies(self) -> list[float] | None:
        """This backward's bucket ready times (s from its start, bucket order) when nothing else about
        its buckets differs from `steady_rows`: the layout read and reported, the step not sampled, the
        reducer's stamps readable. Else None, and the caller takes `resolved()`. Either call uses the
        forward's origin once. For a DDP rank's ordinary steps (`engine.modes.ddp.rank`), whose bucket
        events are then `steady_rows` with these times: what `resolved` gives, without building them."""
        if self._layout_due() or self._named is not self._layout or self.sampler.active \
                or self._forward_ns is None or self.host_enqueue:
            return None
        fwd, self._forward_ns = self._forward_ns, None
        return self._readies(fwd)

    def steady_rows(self) -> list[dict[str, Any]]:
        """Each bucket's event fields on a step with ready times (`steady_readies`), `ready_s` None."""
        return [self._row(i, (None, None, None), READY_SOURCE, False) for i in range(len(self._layout))]

    def _layout_due(self) -> bool:
        """Whether this pass reads the reducer's layout: the first `LAYOUT_READS` passes (DDP rebuilds its
        buckets once, in the 2nd), none read yet, or its indices still missing up to `LAYOUT_RETRIES`."""
        return self.passes <= self.LAYOUT_READS or not self._layout or (
            self._groups is None and self.passes <= self.LAYOUT_RETRIES)

    def _read_layout(self) -> None:
        """The reducer's current buckets: parameter names and bytes, and their parameter indices."""
        from torch.utils._python_dispatch import _disable_current_modes

        # the buckets come as zero copies (the reducer binds no other reader): made outside the
        # memory ledger's mode, so a traced step's peak does not count them; freed at once
        with _disable_current_modes():
            self._layout = [(tuple(self.names.get(p.data_ptr(), "?") for p in b.parameters()),
                             b.buffer().numel() * b.buffer().element_size())
                            for b in self.ddp.reducer._get_zeros_like_grad_buckets()]
            logged = reducer_layout(self.ddp)
            self._groups = [ix for ix, _ in logged] if logged and all(ix is not None for ix, _ in logged) \
                and [b for _, b in logged] == [b for _, b in self._layout] else None

    def _readies(self, fwd: int) -> list[float] | None:
        """Each bucket's ready time (s from the backward's start) from the reducer's stamps of its
        parameters (class docstring), `fwd` the synced forward's return (ns); None without the
        layout's indices."""
        if self._groups is None or len(self._groups) != len(self._layout):
            return None
        base = fwd - self._origin_ns
        try:  # a torch without the reducer's stamps (AttributeError) or a layout they do not cover: claim nothing
            stats = self.ddp.reducer.get_backward_stats()
            return [(base + max(stats[j] for j in group)) / 1e9 for group in self._groups]
        except (AttributeError, IndexError, ValueError):
            return None


def launches(readies: list[float]) -> list[float]:
    """Each bucket's all-reduce launch from its ready time (s, bucket-index order): DDP's reducer launches
    bucket k once it and every bucket before it are ready (`Reducer::mark_bucket_ready` walks `next_bucket_`
    in index order), so at the latest of their ready times."""
    out, latest = [], float("-inf")
    for r in readies:
        latest = max(latest, r)
        out.append(latest)
    return out


def recorder_on(environ: dict[str, str] | None = None) -> bool:
    """Whether this process's flight recorder has a buffer (and this torch a dump)."""
    env = os.environ if environ is None else environ
    size = env.get(FR_BUFFER_ENV) or env.get(NCCL_BUFFER_ENV) or "0"
    return size.isdigit() and int(size) > 0 and dump_function() is not None
