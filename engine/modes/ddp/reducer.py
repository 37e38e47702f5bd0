"""Bucket records from DDP's own reducer, with no comm hook (`bucket_timing=recorder`, issue 31): every
step the reducer's layout (bytes, parameters, order) and its own stamp of each gradient
(`Reducer::get_backward_stats`, ~7 µs a read): on CPU the bucket's ready time, on CUDA the host time
its all-reduce was launched (`enqueue_s`); on gloo's sampled steps also PyTorch's profiler
(`engine.modes.ddp.sampled`). Which runs take this path: `engine.modes.ddp.flight.no_hook_path`
(launched) and `engine.attach.nohook.bucket_timing_of` (attached).
"""

from __future__ import annotations

import time
from typing import Any, Callable

from ddpviz.engine.modes.ddp.sampled import PROFILER_SOURCE, UNPAIRED

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
                or self.sampler.stood_aside or self._forward_ns is None or self.host_enqueue:
            return None  # a sampled step whose profile stood aside: `resolved` says why in `source`
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
