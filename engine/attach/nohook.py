"""The buckets of a DDP watched with `ddpviz run --bucket-timing recorder`, or `auto` (the default) on gloo: no
Python runs per bucket (issue 31, docs/bucket-timing.md).

`engine.attach.ddp.Watch` registers nothing on the DDP: DDP's reducer divides each gradient by
world_size while copying it into its bucket and all-reduces the bucket in C++, as without ddpviz.
Its `bucket` events come from the launched runs' readers (`engine.modes.ddp.reducer`, `.flight`), once per step:

- gloo (and any backend without a flight-recorder dump): `LayoutBuckets`, DDP's reducer layout —
  bytes, parameters and order every step; on CPU modules each bucket's `ready_s` from the reducer's
  own gradient-ready stamps (once its layout is rebuilt), so the step's exposed comm is measured;
  all-reduce times null (`source` says not measured) — except on the sampled steps (the
  memory-traced ones, `engine.attach.memory.STEPS_HINT`: 0-2 and every 200th), where PyTorch's
  profiler gives `ready_s`, `comm_start_s`, `comm_end_s` and `sampled: true` (`engine.modes.ddp.sampled`);
- CUDA: the same layout every step with each bucket's host launch (`enqueue_s`, the reducer's stamps,
  `LayoutBuckets`), and with NCCL's flight recorder on (`ddpviz run` sets its variables,
  `engine.attach.env`) on the sampled steps `FlightBuckets` — host enqueue times and, where NCCL's
  watchdog had retired the collective by the read, its GPU duration (`comm_duration_s`; no span: the GPU
  starts later than the host enqueues), `sampled: true`. The recorder is read on sampled steps only: a dump
  costs ~5-30 µs per entry it holds (issue 31: 166 entries 4.8 ms on an H200 host), more than the
  Python hook it replaces on a step of few buckets. A sampled step whose all-reduces the recorder
  did not all hold (a buffer too small, a recorder off) keeps the layout, times null, its `source`
  saying why.

A comm hook of the script's own (`register_comm_hook`, a built-in hook, DDP's `mixed_precision`
upcast) goes to DDP directly, unwrapped: DDP keeps one hook, and training stays what the script's
hook makes it. Its buckets' bytes are then the bucket's (before compression) and their times are
not measured, sampled steps included (`SCRIPT_HOOK_SOURCE`).
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from ddpviz.engine.modes.ddp.flight import FlightBuckets, FlightReader, dump_function, recorder_on
from ddpviz.engine.modes.ddp.reducer import (READY_EXPOSED_SOURCE, READY_SOURCE, LayoutBuckets,
                                             reducer_layout)

NBYTES_SOURCE = "DDP's reducer layout: the bucket buffer's bytes (no comm hook)"
SCRIPT_HOOK_NBYTES_SOURCE = ("DDP's reducer layout: the bucket buffer's bytes, before the script's comm hook "
                             "(what it hands to the all-reduce is not measured)")
SCRIPT_HOOK_SOURCE = ("DDP's reducer layout: bucket bytes (before the script's comm hook), parameters and order; "
                      "ready, all-reduce start and end not measured: the script's comm hook holds DDP's one hook "
                      "slot (no hook of ddpviz's on this DDP: bucket_timing=recorder, or auto with a built-in hook, "
                      "registers none and wraps none of the script's)")
FLIGHT_MISSED_SOURCE = ("DDP's reducer layout: bytes and order, the host launch (enqueue_s) from its stamps where "
                        "given; GPU durations not measured: the flight recorder held {got} all-reduces of this "
                        "backward for {want} buckets")
NOT_MEASURED_NOTE = "not measured on this step (bucket_timing=recorder: bucket times on sampled steps only)"


def bucket_timing_of(session: Any, ddp: Any, device: Any) -> str:
    """"hook" or "recorder" for `ddp`, whose parameters are on `device`: the session's `bucket_timing`, "auto"
    resolved by the backend DDP all-reduces with and its `find_unused_parameters`
    (`engine.config.resolve_bucket_timing`: the recorder on gloo without it); the hook, whatever was asked, for a
    model with sparse gradients, as in launched runs
    (`engine.modes.ddp.flight.no_hook_path`: the reducer's layout gives dense sizes, only the hook sees what a
    sparse bucket sends). A group of several backends ("cpu:gloo,cuda:nccl", `init_process_group()` with none
    named) counts as the one for `device`'s type."""
    from ddpviz.engine.config import resolve_bucket_timing
    from ddpviz.engine.modes.ddp.buckets import expect_sparse_gradient

    backend = str(dist.get_backend(ddp.process_group))
    if ":" in backend:
        backend = dict(part.split(":", 1) for part in backend.split(",")).get(device.type, backend)
    timing = resolve_bucket_timing(session.bucket_timing, backend, bool(getattr(ddp, "find_unused_parameters", False)))
    return "hook" if timing == "recorder" and any(expect_sparse_gradient(ddp.module)) else timing


class NoHookBuckets:
    """Bucket records of one DDP that has no ddpviz comm hook (module docstring).

    Args:
        ddp: the `DistributedDataParallel`.
        names: parameter name by `data_ptr()`.
        flight: a `FlightReader` to use (a stand-in dump in tests); default: PyTorch's recorder on
            NCCL when it is on, else none (`LayoutBuckets`).
    """

    def __init__(self, ddp: Any, names: dict[int, str], flight: FlightReader | None = None):
        self.ddp = ddp
        self.script_hook: str | None = None  # the script's own hook, once DDP has one
        backend = dist.get_backend(ddp.process_group)
        self.layout_reader = LayoutBuckets(ddp, names)
        self.sampling = backend == "gloo"  # the profiler's spans are gloo's (engine.modes.ddp.sampled)
        if flight is None and backend == "nccl" and recorder_on() and dump_function(backend) is not None:
            flight = FlightReader(backend=backend)
        ordered = [names.get(p.data_ptr(), "?") for p in ddp.module.parameters() if p.requires_grad]
        self.flight = FlightBuckets(flight, lambda: reducer_layout(ddp), ordered) if flight is not None else None
        self.synced = 0  # synced backwards since the last `resolved` (several in a step: bytes carried)
        self.read_flight = False  # the latest synced backward is a sampled one: read the recorder after it

    def note_script_hook(self, hook: Any) -> None:
        """The script gave DDP a comm hook of its own (a function, or a built-in hook's type)."""
        self.script_hook = getattr(hook, "__qualname__", None) or str(hook)

    def forward_returned(self) -> None:
        """Right after a forward of this DDP that will all-reduce (`LayoutBuckets.forward_returned`)."""
        self.layout_reader.forward_returned()

    def begin_backward(self, sample: bool) -> None:
        """Right before a synced backward; `sample`: a sampled step (gloo: profile it; NCCL: read the
        flight recorder after it), unless the script's hook holds DDP's slot."""
        self.synced += 1
        sampler = self.layout_reader.sampler
        if sampler.active:  # an earlier backward of the step was profiled: its spans are not this one's
            sampler.spans()
        sample = sample and self.script_hook is None
        self.layout_reader.sample_next = sample and self.sampling
        self.layout_reader.begin_backward()
        self.read_flight = sample and self.flight is not None
        if self.read_flight:
            self.flight.begin_backward()

    def stop_profiling(self) -> None:
        """Stop a sampled backward's profile that no `resolved` read (`SampledSpans.stop`)."""
        if self.layout_reader.sampler.active:
            self.layout_reader.sampler.stop()

    def resolved(self) -> list[dict[str, Any]]:
        """The latest synced backward's bucket records (`engine.modes.ddp.flight`'s fields), with
        `nbytes_source`; call once per step, after it."""
        self.synced = 0
        out = self.layout_reader.resolved()
        if self.read_flight and self.script_hook is None:
            timed = self.flight.resolved()
            if [r["nbytes"] for r in timed] == [r["nbytes"] for r in out]:
                out = [dict(t, num_params=r["num_params"], sampled=True,
                            **{k: r[k] for k in ("param_names",) if k in r}) for t, r in zip(timed, out)]
            else:
                source = FLIGHT_MISSED_SOURCE.format(got=len(timed), want=len(out))
                out = [dict(r, source=source) for r in out]
        for r in out:
            r["nbytes_source"] = NBYTES_SOURCE
            if self.script_hook is not None:
                r.update(ready_s=None, comm_start_s=None, comm_end_s=None, sampled=False, source=SCRIPT_HOOK_SOURCE,
                         comm_hook=self.script_hook, nbytes_source=SCRIPT_HOOK_NBYTES_SOURCE)
        return out

    def layout(self) -> list[dict[str, Any]]:
        """The current layout as `run_started`'s `bucket_preview` rows."""
        return [dict(bucket_index=i, nbytes=nbytes, num_params=len(params), param_names=list(params), sparse=False)
                for i, (params, nbytes) in enumerate(self.layout_reader._layout)]


def comm_exposed(buckets: list[dict[str, Any]], last_bwd_s: float) -> tuple[float, dict[str, Any]]:
    """(exposed comm in s, the step's extra fields) of a DDP with no hook: the backward's time after
    its last bucket was ready where every bucket's `ready_s` was measured (a sampled step's profiler,
    or on gloo DDP's reducer's own ready times, `engine.modes.ddp.reducer.LayoutBuckets`, every step
    once its layout is rebuilt), else not measured (`comm_exposed_measured` false, which makes the
    step's figure null, with a note)."""
    if buckets and all(b.get("ready_s") is not None for b in buckets):
        reducer = buckets[0].get("source") == READY_SOURCE
        return max(0.0, last_bwd_s - max(b["ready_s"] for b in buckets)), dict(
            comm_exposed_measured=True, **(dict(comm_exposed_source=READY_EXPOSED_SOURCE) if reducer else {}))
    return 0.0, dict(comm_exposed_measured=False, comm_exposed_note=NOT_MEASURED_NOTE)
