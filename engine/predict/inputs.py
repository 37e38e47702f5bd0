"""What one measured run gives the scale-out predictor (`engine.predict.scaleout`): medians of its steady
steps, DDP's bucket layout and ready times, DP's phase costs, and this machine's link.

Pure Python (no torch). Every number here is read from the run's events (docs/events.md);
`measure_run` names the events each one comes from in `RunInputs.sources`.

- Steady steps: the run's own summary's (`engine.summary.run_steps`, `steady_steps`): per step the
  mean over ranks, warm-up and instrumented steps left out; every figure is a median over them.
- DDP `other_s` = step_time − forward − backward − exposed comm − optimizer (medians): data
  loading, the loss's `.item()`, the step's Python. DP's `other` is likewise the median step
  minus the phases' median wall times: the Python between phases.
- DDP bucket ready fractions: a bucket's `ready_s` / the step's last `ready_s` (= the rank's
  backward compute, `backward_s`), so the pipeline can be rescaled to another backward time.
- `comm_busy_s`: per step and rank, how long at least one all-reduce was in flight (the union
  of the buckets' intervals), median: the link's measured work per step.
- This machine's link for DDP (`link_fit`): the `allreduce_probe` event's fitted alpha/beta when
  the run has one, else the ring model fitted to the run's own buckets that ran alone
  (`engine.analysis.fit_ring_model`: t = 2(n−1)·α + 2(n−1)/n·b/β), else, with one bucket size,
  β from the median bucket time and α = 0 (said in `source`).
- DP phases (`dp_phases`, per phase): device 0's span (`hub_s`, which holds the n−1 copies of a
  copy phase one after another), the bytes each other device received or sent (`bytes_per_copy`),
  the slowest device's own span (`device_s`) and the phase's wall time across devices (`wall_s`:
  first start to last end, so `wall_s − device_s` is the thread dispatch and GIL wait).
"""

from __future__ import annotations

import heapq
import statistics
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

from ddpviz.engine.analysis import fit_covers, fit_ring_model, format_bytes, ring_factor
from ddpviz.engine.summary import interval_union_s, run_steps, steady_steps

Event = dict[str, Any]
DP_COPY_PHASES = ("broadcast", "scatter", "gather", "reduce")
DP_THREAD_PHASES = ("forward", "backward")
DP_HUB_PHASES = ("loss", "optimizer")


class PredictInputError(ValueError):
    """The run cannot calibrate the predictor (no run_started, no steady steps, wrong mode)."""


@dataclass
class RunInputs:
    """Medians of one measured run, in seconds, bytes and samples.

    `forward_s`, `backward_s`, `optimizer_s`, `comm_exposed_s`, `other_s` and `step_time_s` are
    per step of one rank (DDP) or of the DP step; `per_device_batch` = global_batch_size /
    world_size (samples each device computes per step).
    """

    run_id: str
    mode: str
    world_size: int
    global_batch_size: int
    grad_bytes: int
    param_count: int
    device_kind: str
    backend: str | None
    emulated: bool
    host_cpu_count: int | None
    cpu_threads_per_device: int | None
    amp: bool
    overlap: bool
    optimizer: str
    tokens_per_sample: int
    steps_used: int
    step_time_s: float
    samples_per_s: float
    forward_s: float
    backward_s: float
    comm_exposed_s: float
    optimizer_s: float
    other_s: float
    buckets: list[dict[str, Any]] = field(default_factory=list)
    comm_busy_s: float = 0.0
    link_fit: dict[str, Any] | None = None
    dp_phases: dict[str, dict[str, float]] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)  # what -> the event type it came from

    @property
    def per_device_batch(self) -> float:
        return self.global_batch_size / self.world_size

    @property
    def compute_s(self) -> float:
        """Forward + backward of one device: the part of a step that scales with its batch."""
        return self.forward_s + self.backward_s

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _median(values: Iterable[float]) -> float:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else 0.0


def steady_rows(events: list[Event], fastest_share: float = 1.0) -> list[Event]:
    """The run's steps (`engine.summary.run_steps`: the mean over ranks) that its summary's
    medians use (`engine.summary.steady_steps`); with `fastest_share` < 1, only that share of them
    with the shortest step time (at least one), in step order."""
    kept = steady_steps(run_steps(e for e in events if e.get("type") == "step"))
    if fastest_share < 1.0:
        kept = sorted(kept, key=lambda r: r["step_time_s"])[:max(1, round(len(kept) * fastest_share))]
    return sorted(kept, key=lambda r: r["step"])


def _step_medians(steps: list[Event]) -> dict[str, float]:
    keys = ("step_time_s", "forward_s", "backward_s", "comm_exposed_s", "optimizer_s", "samples_per_s")
    out = {k: _median(e[k] for e in steps) for k in keys}
    out["other_s"] = max(0.0, out["step_time_s"] - out["forward_s"] - out["backward_s"]
                         - out["comm_exposed_s"] - out["optimizer_s"])
    return out


def bucket_layout(buckets: list[Event]) -> list[dict[str, Any]]:
    """Per bucket: bytes, median ready fraction of the backward compute and median all-reduce
    duration.

    Returns ``[{bucket_index, nbytes, ready_frac, comm_s}]`` in the order the buckets are
    launched, from steady steps of every rank: bucket order (each DDP launches its buckets in
    index order), and where a process has several DDPs reducing in one backward (an attached GAN;
    `ddp_index` on its events), their buckets interleaved by ready fraction (each DDP's in index
    order), numbered 0, 1, ... in that order.
    """
    by_rank_step: dict[tuple[int, int], list[Event]] = defaultdict(list)
    for b in buckets:
        by_rank_step[(b.get("rank", 0), b["step"])].append(b)
    fracs: dict[tuple[int, int], list[float]] = defaultdict(list)
    durs: dict[tuple[int, int], list[float]] = defaultdict(list)
    nbytes: dict[tuple[int, int], int] = {}
    for group in by_rank_step.values():
        last = max(b["ready_s"] for b in group)
        for b in group:
            key = (int(b.get("ddp_index") or 0), int(b["bucket_index"]))
            fracs[key].append(b["ready_s"] / last if last > 0 else 1.0)
            nbytes[key] = int(b["nbytes"])
            if b.get("comm_end_s") is not None and b.get("comm_start_s") is not None:
                durs[key].append(b["comm_end_s"] - b["comm_start_s"])
    per_ddp: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for key in sorted(fracs):
        per_ddp[key[0]].append(dict(nbytes=nbytes[key], ready_frac=min(1.0, _median(fracs[key])),
                                    comm_s=_median(durs[key])))
    merged = heapq.merge(*per_ddp.values(), key=lambda b: b["ready_frac"]) if len(per_ddp) > 1 \
        else (b for bs in per_ddp.values() for b in bs)
    return [dict(bucket_index=i, **b) for i, b in enumerate(merged)]


def comm_busy_s(buckets: list[Event]) -> float:
    """Median over (rank, step) of the time at least one all-reduce was in flight: the union of
    the buckets' [comm_start, comm_end] (`engine.summary.interval_union_s`)."""
    by: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for b in buckets:
        if b.get("comm_start_s") is not None and b.get("comm_end_s") is not None:
            by[(b.get("rank", 0), b["step"])].append((b["comm_start_s"], b["comm_end_s"]))
    return _median(interval_union_s(v) for v in by.values())


def alone(buckets: list[Event]) -> list[Event]:
    """Buckets whose all-reduce overlapped no other all-reduce of the same rank and step (gloo
    runs two at a time, which would stretch their times; see docs/events.md)."""
    by: dict[tuple[int, int], list[Event]] = defaultdict(list)
    for b in buckets:
        if b.get("comm_start_s") is not None and b.get("comm_end_s") is not None:
            by[(b.get("rank", 0), b["step"])].append(b)
    out = []
    for group in by.values():
        for b in group:
            if not any(o is not b and o["comm_start_s"] < b["comm_end_s"] and b["comm_start_s"] < o["comm_end_s"]
                       for o in group):
                out.append(b)
    return out


def fit_link(probe: Event | None, buckets: list[Event], world_size: int) -> dict[str, Any] | None:
    """This machine's alpha/beta for DDP: the probe's fit, else the buckets' (see module doc). With
    the probe's, `source` names the sizes it was fitted on and, where the run's buckets lie outside
    them, says the model is extrapolated there (`_outside_fit`)."""
    if probe and probe.get("fit") and probe["fit"].get("beta_bytes_per_s"):
        f = probe["fit"]
        used = f.get("points_used") or []
        span = f" ({format_bytes(min(used))}–{format_bytes(max(used))})" if used else ""
        return dict(alpha_s=max(0.0, float(f.get("alpha_s") or 0.0)),
                    beta_bytes_per_s=float(f["beta_bytes_per_s"]),
                    source=f"all-reduce probe of this run ({probe.get('source') or 'measured'}), "
                           f"ring model fitted to {len(used)} sizes{span}{_outside_fit(probe, buckets)}")
    if world_size < 2:
        return None
    solo = alone(buckets)
    timed = [b for b in buckets if b.get("comm_start_s") is not None and b.get("comm_end_s") is not None]
    for chosen, which in ((solo, "that ran alone"), (timed, "(none ran alone: all of them, so each "
                                                             "time includes sharing the link)")):
        fit = fit_ring_model(chosen, world_size)
        if fit and fit["s_per_byte"] > 0 and fit["latency_s"] >= 0:
            return dict(alpha_s=fit["alpha_s"], beta_bytes_per_s=fit["beta_bytes_per_s"],
                        source=f"ring model fitted to {len(chosen)} in-run bucket all-reduces {which}; "
                               "no probe event in this run")
    chosen = solo or timed
    rates = [ring_factor(world_size) * b["nbytes"] / (b["comm_end_s"] - b["comm_start_s"])
             for b in chosen if b["comm_end_s"] > b["comm_start_s"]]
    if not rates:
        return None
    return dict(alpha_s=0.0, beta_bytes_per_s=_median(rates),
                source=f"median busbw of {len(rates)} in-run bucket all-reduces "
                       f"{'that ran alone' if solo else '(none ran alone)'}; no probe, and no line "
                       "through their times (one size, or a negative latency or slope): alpha taken as 0")


def _outside_fit(probe: Event, buckets: list[Event]) -> str:
    """What `fit_link`'s source adds when the run's bucket sizes lie outside the sizes the probe's ring
    model was fitted on: the model is extrapolated there, with the probe's own measured time at the
    nearest size to the run's median bucket against the model's time for it ("" when inside, or
    without bucket sizes or points)."""
    f, sizes = probe["fit"], [b["nbytes"] for b in buckets if b.get("nbytes")]
    used, points = f.get("points_used") or [], probe.get("points") or []
    if not used or fit_covers(f, sizes):
        return ""
    size = statistics.median(sizes)
    out = (f"; the run's buckets ({format_bytes(size)}, median) lie outside those sizes: the model is "
           "extrapolated there")
    near = min(points, key=lambda p: abs(p["nbytes"] - size), default=None)
    if near and f.get("s_per_byte") is not None and f.get("latency_s") is not None:
        model = f["latency_s"] + f["s_per_byte"] * near["nbytes"]
        out += (f" (at {format_bytes(near['nbytes'])} the probe measured {near['time_s'] * 1e3:.3g} ms, "
                f"the model says {model * 1e3:.3g} ms)")
    return out


def dp_phase_costs(phases: list[Event], steps: dict[int, Event], device0: str) -> dict[str, dict[str, float]]:
    """Median per-phase costs of DP's steady steps (see module doc). `steps`: step events by step."""
    per_step: dict[int, dict[str, list[Event]]] = defaultdict(lambda: defaultdict(list))
    for p in phases:
        if p["step"] in steps:
            per_step[p["step"]][p["phase"]].append(p)
    acc: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for by_phase in per_step.values():
        for name, spans in by_phase.items():
            wall = max(p["end_s"] for p in spans) - min(p["start_s"] for p in spans)
            hub = [p for p in spans if p["device"] == device0]
            rest = [p for p in spans if p["device"] != device0]
            a = acc[name]
            a["wall_s"].append(wall)
            a["device_s"].append(max(p["end_s"] - p["start_s"] for p in spans))
            a["hub_s"].append(sum(p["end_s"] - p["start_s"] for p in hub))
            if rest:
                a["bytes_per_copy"].append(_median(p.get("nbytes") or 0 for p in rest))
                a["copy_s"].append(_median(p["end_s"] - p["start_s"] for p in rest))
    out = {name: {k: _median(v) for k, v in a.items()} for name, a in acc.items()}
    step_s = _median(e["step_time_s"] for e in steps.values())
    out["other"] = {"wall_s": max(0.0, step_s - sum(p["wall_s"] for p in out.values()))}
    return out


def _started(events: list[Event]) -> Event:
    started = next((e for e in events if e.get("type") == "run_started"), None)
    if started is None:
        raise PredictInputError("the run has no run_started event: it cannot calibrate the predictor")
    if started.get("mode") not in ("dp", "ddp", "single"):
        raise PredictInputError(f"mode must be dp, ddp or single (got {started.get('mode')!r})")
    return started


def measure_run(events: list[Event], fastest_share: float = 1.0) -> RunInputs:
    """Calibration inputs from one run's events (any order).

    Args:
        fastest_share: keep only this share of the steady steps, the fastest (1.0: all, the
            run's own summary's choice). On a machine shared with other work, load only ever
            adds time, so the faster steps are the closer look at the machine itself.

    Raises:
        PredictInputError: no run_started, or no step events; fastest_share not in (0, 1].
    """
    if not 0 < fastest_share <= 1:
        raise PredictInputError(f"fastest_share must be in (0, 1] (got {fastest_share})")
    started = _started(events)
    cfg = started.get("config") or {}
    steps = steady_rows(events, fastest_share)
    keep = {r["step"] for r in steps}
    if not steps:
        raise PredictInputError("the run has no step events yet: nothing to calibrate on")
    n = int(started["world_size"])
    med = _step_medians(steps)
    devices = started.get("devices") or [{}]
    inputs = RunInputs(
        run_id=started.get("run_id", ""), mode=started["mode"], world_size=n,
        global_batch_size=int(cfg.get("global_batch_size") or steps[0]["samples"]),
        grad_bytes=int(started.get("grad_bytes") or 0), param_count=int(started.get("param_count") or 0),
        device_kind=devices[0].get("kind", "cpu"), backend=started.get("backend"), emulated=bool(started.get("emulated")),
        host_cpu_count=started.get("host_cpu_count"), cpu_threads_per_device=started.get("cpu_threads_per_device"),
        amp=bool(cfg.get("amp")), overlap=cfg.get("overlap") is not False, optimizer=cfg.get("optimizer", "sgd"),
        tokens_per_sample=int(cfg.get("block_size") or 1) if cfg.get("model") == "gpt" else 1,
        steps_used=len(steps), **med)
    inputs.sources = {"step split": "step"}
    if started["mode"] == "ddp":
        buckets = [e for e in events if e.get("type") == "bucket" and e["step"] in keep]
        inputs.buckets = bucket_layout(buckets)
        inputs.comm_busy_s = comm_busy_s(buckets)
        probe = next((e for e in events if e.get("type") == "allreduce_probe"), None)
        inputs.link_fit = fit_link(probe, buckets, n)
        inputs.sources["buckets"] = "bucket"
        if probe:
            inputs.sources["link"] = "allreduce_probe"
    elif started["mode"] == "dp":
        by_step = {e["step"]: e for e in steps}
        phases = [e for e in events if e.get("type") == "dp_phase"]
        names = started.get("device_names") or ["cpu:0"]
        inputs.dp_phases = dp_phase_costs(phases, by_step, names[0])
        inputs.sources["dp phases"] = "dp_phase"
    return inputs
