"""The instrument's host cost per bucket, and per step against a plain run alone (issue 31).

`bucket_cost(cfg)`: `engine.harness.overhead.measure_overhead` (plain torch DDP and ddpviz DDP
taking turns block by block) at two bucket caps on the same model. Per round, ddpviz's extra step
time over plain's is taken; the per-step costs (events, the step's clocks) are the same at both
caps, so the slope of the extra time against the bucket count is what ddpviz adds per bucket:

    per_bucket_s = (extra(small cap) - extra(large cap)) / (buckets(small) - buckets(large))

with a 90% interval from the two caps' bootstrap intervals (lowest and highest slopes they allow).
Bucket counts: PyTorch's own assignment rule on the run's gradient-ready order
(`engine.modes.ddp.buckets.preview_buckets`, the rebuilt layout).

`plain_alone(cfg)`: whole runs, each ddpviz run between two plain ones (plain, ddpviz, plain), each alone on the
machine, so ddpviz's background threads (memory timer, event flusher, launcher's follower) are
not charged to the plain side as they are while the sides interleave (`measure_overhead`'s
design). Step time: rank 0's median interval between step starts after `warmup_steps`. Beside it,
the two direct costs such whole runs resolve where their ratio cannot (a few per cent): the training
thread's time between steps (`between_steps_s`) and ddpviz's own threads' CPU (`OwnThreadsCpu`).

`direct_cost(cfg)`: those two at two bucket caps, their slopes per bucket.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from ddpviz.engine.config import RunConfig
from ddpviz.engine.measure.bootstrap import median_interval
from ddpviz.engine.measure.own_threads import own_threads_cpu_ns


def bucket_count(cfg: RunConfig) -> int:
    """Buckets per step after DDP's rebuild, by PyTorch's own rule (`preview_buckets`)."""
    from ddpviz.engine.components.preflight import probe_batch
    from ddpviz.engine.data import load_dataset
    from ddpviz.engine.models import build_model
    from ddpviz.engine.modes.ddp.buckets import preview_buckets

    ds = load_dataset(cfg)
    x, y = probe_batch(cfg, ds)
    return len(preview_buckets(cfg, build_model(cfg, ds), x, y)["rebuilt"])


def bucket_cost(cfg: RunConfig, caps_mb: tuple[float, float] = (25.0, 0.01), rounds: int = 6,
                block_steps: int = 30) -> dict[str, Any]:
    """ddpviz's extra host time per bucket per step (module docstring); seconds.

    Raises:
        ValueError: the two caps give the same bucket count (no slope to measure).
    """
    from ddpviz.engine.harness.overhead import measure_overhead

    caps = []
    for cap in caps_mb:
        c = cfg.model_copy(update=dict(bucket_cap_mb=cap))
        got = measure_overhead(c, rounds, block_steps=block_steps)
        extra = [r["ddpviz_median_step_s"] - r["plain_median_step_s"] for r in got["rounds"]]
        caps.append(dict(bucket_cap_mb=cap, buckets=bucket_count(c), extra_s=statistics.median(extra),
                         extra_interval_90=median_interval(extra), extra_per_round_s=extra,
                         ratio=got["ratio"], ratio_interval_90=got["ratio_interval_90"],
                         plain_median_step_s=got["plain_median_step_s"],
                         ddpviz_median_step_s=got["ddpviz_median_step_s"], max_param_diff=got["max_param_diff"]))
    big, small = caps
    dn = small["buckets"] - big["buckets"]
    if dn == 0:
        raise ValueError(f"caps {caps_mb} give the same bucket count ({big['buckets']}): no slope")
    lo = (small["extra_interval_90"][0] - big["extra_interval_90"][1]) / dn
    hi = (small["extra_interval_90"][1] - big["extra_interval_90"][0]) / dn
    return dict(per_bucket_s=(small["extra_s"] - big["extra_s"]) / dn, per_bucket_interval_90=[lo, hi],
                caps=caps, rounds=rounds, block_steps=block_steps, config=cfg.to_json_dict(),
                source="measured: slope of ddpviz's extra step time (over plain torch DDP, taking turns "
                       "block by block) between two bucket caps, per bucket")


def _plain_run(cfg: RunConfig, tmp: str) -> tuple[list[float], list[float]]:
    """Plain torch DDP alone: rank 0's step starts and ends (unix s)."""
    from ddpviz.engine.components.devices import resolve_plan
    from ddpviz.engine.harness.overhead import _plain_rank
    from ddpviz.engine.modes.ranks import start_rank_processes

    plan = resolve_plan(cfg)
    ctx = start_rank_processes(_plain_rank, (cfg.to_json_dict(), plan.backend, plan.kind, f"{tmp}/pg", tmp),
                               cfg.world_size, join=False)
    while not ctx.join():
        pass
    Path(f"{tmp}/pg").unlink(missing_ok=True)
    got = json.loads(Path(tmp, "plain.json").read_text())
    return got["step_starts"], got["step_ends"]


def between_steps_s(starts: list[float], ends: list[float], warmup_steps: int) -> float:
    """Median time from one step's end to the next step's start after `warmup_steps` (s): what the
    training thread runs between steps. Plain DDP: its loop's own turn (`_plain_rank`: a clock read and
    the gate check); ddpviz: that plus the instrument's work after the step's training (reading the
    reducer, building and handing over the step's events, the step loop's checks). Serial with
    training, so it adds to every step's time on any machine; the median is a typical step's (the
    metered and traced steps, minorities, have their own costs: `_step_intervals_s`'s mean)."""
    gaps = [b - a for a, b in zip(ends[warmup_steps:], starts[warmup_steps + 1:])]
    return statistics.median(gaps)


def _step_intervals_s(starts: list[float], warmup_steps: int) -> tuple[float, float]:
    """(median, mean) of the intervals between step starts after `warmup_steps`: the median is a
    typical step; the mean is the run's pace, sampled steps (memory tracing, the profiler) included."""
    s = starts[warmup_steps:]
    d = [b - a for a, b in zip(s, s[1:])]
    return statistics.median(d), statistics.fmean(d)


class OwnThreadsCpu:
    """While open, polls the on-CPU time of ddpviz's named threads (`engine.measure.own_threads`) in
    this process and its descendants every `interval_s`, keeping each thread's latest reading; a thread
    already alive when the block began counts from its reading then. After the block: `.by_name` (ns by
    OS name) and `.total_ns` — None where /proc cannot be read (not Linux), never a 0 that was not
    measured. A thread's CPU after its last poll (at most `interval_s` of its life) is missed; the poller
    itself is not named, so not counted.
    """

    def __init__(self, interval_s: float = 0.05):
        self.interval_s, self.by_name = interval_s, {}
        self.total_ns: int | None = None
        self._latest: dict[tuple[int, int], tuple[str, int]] = {}
        self._before: dict[tuple[int, int], int] = {}

    def _read(self) -> dict[tuple[int, int], tuple[str, int]]:
        import os

        import psutil

        me = psutil.Process(os.getpid())
        pids = [me.pid]
        with contextlib.suppress(psutil.Error):
            pids += [p.pid for p in me.children(recursive=True)]
        return {(pid, tid): got for pid in pids for tid, got in own_threads_cpu_ns(pid).items()}

    def __enter__(self) -> "OwnThreadsCpu":
        import threading

        self._before = {k: ns for k, (_, ns) in self._read().items()}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _poll(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._latest.update(self._read())
        self._latest.update(self._read())  # the last reading, once the block has ended

    def __exit__(self, *exc: Any) -> None:
        import os

        self._stop.set()
        self._thread.join()
        for key, (name, ns) in self._latest.items():
            self.by_name[name] = self.by_name.get(name, 0) + ns - self._before.get(key, 0)
        self.total_ns = sum(self.by_name.values()) if os.path.isdir(f"/proc/{os.getpid()}/task") else None


# 800-step runs with 50 left out (2026-12-05): six rounds ratios 1.19-1.25, where 120-step runs had moved
# 1.12-1.47 between tries (docs/bench/small-step-alone-2026-12-05.json)
def bracketed(before: float, ours: float, after: float) -> tuple[float, float]:
    """(ours over the mean of the plain runs before and after it, after over before): a run bracketed by
    two plain runs (A B A) cancels a drift of the machine that is linear over the three runs, and the two
    plain runs against each other (A/A) show what the harness resolves."""
    return ours / ((before + after) / 2), after / before


def plain_alone(cfg: RunConfig, rounds: int = 4, warmup_steps: int = 50) -> dict[str, Any]:
    """ddpviz DDP vs plain torch DDP, whole runs alone, each ddpviz run between two plain ones
    (`bracketed`; module docstring). Besides the A/B figures, `plain_vs_plain`: the second plain run
    over the first, per round, and their median and interval: the harness's own noise (2026-12-06 here:
    0.86-1.14 between back-to-back identical runs)."""
    from ddpviz.engine.harness.overhead import _ddpviz_run

    cfg = cfg.model_copy(update=dict(mode="ddp", step_delay_s=0.0, eval_every=0, probe=False))
    rows = []
    for k in range(rounds):
        with tempfile.TemporaryDirectory(prefix="ddpviz-alone-") as tmp:
            got = []
            for side in ("plain", "ddpviz", "plain"):
                with OwnThreadsCpu() as threads:
                    starts, ends = _plain_run(cfg, tmp) if side == "plain" else _ddpviz_run(cfg, f"alone-{k}")[::2]
                got.append((*_step_intervals_s(starts, warmup_steps), between_steps_s(starts, ends, warmup_steps),
                            threads))
        (pm, pa, pg, _), (dm, da, dg, threads), (qm, qa, qg, _) = got
        ratio, aa = bracketed(pm, dm, qm)
        rows.append(dict(order=["plain", "ddpviz", "plain"], plain_median_step_s=[pm, qm], ddpviz_median_step_s=dm,
                         plain_mean_step_s=[pa, qa], ddpviz_mean_step_s=da, ratio=ratio,
                         mean_ratio=bracketed(pa, da, qa)[0], plain_vs_plain=aa,
                         plain_between_steps_s=(pg + qg) / 2, ddpviz_between_steps_s=dg,
                         background_us_per_step=None if threads.total_ns is None
                         else threads.total_ns / 1e3 / cfg.steps,
                         background_by_thread_us_per_step={n: ns / 1e3 / cfg.steps
                                                           for n, ns in threads.by_name.items()}))
    ratios, means = [r["ratio"] for r in rows], [r["mean_ratio"] for r in rows]
    aas = [r["plain_vs_plain"] for r in rows]
    plain_step = [statistics.fmean(r["plain_median_step_s"]) for r in rows]
    added = [(r["ddpviz_between_steps_s"] - r["plain_between_steps_s"]) / p for r, p in zip(rows, plain_step)]
    return dict(ratio=statistics.median(ratios), ratio_interval_90=median_interval(ratios),
                mean_ratio=statistics.median(means), mean_ratio_interval_90=median_interval(means),
                plain_vs_plain=statistics.median(aas), plain_vs_plain_interval_90=median_interval(aas),
                between_steps_us=dict(plain=statistics.median(r["plain_between_steps_s"] for r in rows) * 1e6,
                                      ddpviz=statistics.median(r["ddpviz_between_steps_s"] for r in rows) * 1e6),
                between_steps_share=statistics.median(added), between_steps_share_interval_90=median_interval(added),
                background_us_per_step=None if any(r["background_us_per_step"] is None for r in rows)
                else statistics.median(r["background_us_per_step"] for r in rows),
                rounds=rows,
                warmup_steps=warmup_steps, config=cfg.to_json_dict(),
                source="measured: whole runs, each alone, every ddpviz run between two plain ones (A B A, "
                       "`bracketed`); rank 0's intervals between step starts: `ratio` of the medians (a typical "
                       "step) over the mean of the two plain runs', `mean_ratio` of the means (the run's pace, "
                       "sampled steps included); medians over the rounds; `plain_vs_plain`: the second plain run "
                       "over the first (the harness's own noise: a ratio inside it is not resolved); "
                       "`between_steps_us`: rank 0's median time from a step's end to the next start (the training "
                       "thread's work between steps, `between_steps_s`), and `between_steps_share` ddpviz's extra "
                       "there over plain's median step; `background_us_per_step`: CPU of ddpviz's own threads (event "
                       "writers, memory timers, the launcher's follower; all ranks together) per step, from their "
                       "schedstat (engine.measure.own_threads)")


DIRECT_SOURCE = ("measured: at two bucket caps, whole runs taking turns with plain DDP alone (`plain_alone`); "
                 "the training thread's time between steps over plain's (rank 0's median) and ddpviz's threads' CPU "
                 "per step (schedstat; all ranks and the follower); slopes against PyTorch's bucket count")


def direct_cost(cfg: RunConfig, caps_mb: tuple[float, float] = (25.0, 0.01), rounds: int = 2, steps: int = 400,
                warmup_steps: int = 50) -> dict[str, Any]:
    """ddpviz's direct cost per bucket (`DIRECT_SOURCE`), resolvable where the whole-step A/B is not:
    what the training thread runs between steps (reading the reducer, the bucket events) and what
    ddpviz's own threads spend (writing, forwarding those events), each against the bucket count. For
    `bucket_timing=recorder`, whose per-bucket work is all there; the hook's runs inside the backward,
    which this does not see (`bucket_cost` measures it).

    Returns: per cap `buckets`, `between_steps_us` (ddpviz's minus plain's), `background_us_per_step`;
    `between_steps_us_per_bucket`, `background_us_per_bucket` (slopes, µs). Raises ValueError when the caps
    give the same bucket count.
    """
    caps = []
    for cap in caps_mb:
        c = cfg.model_copy(update=dict(bucket_cap_mb=cap, steps=steps))
        got = plain_alone(c, rounds=rounds, warmup_steps=warmup_steps)
        caps.append(dict(bucket_cap_mb=cap, buckets=bucket_count(c),
                         between_steps_us=got["between_steps_us"]["ddpviz"] - got["between_steps_us"]["plain"],
                         background_us_per_step=got["background_us_per_step"], ratio=got["ratio"]))
    big, small = caps
    dn = small["buckets"] - big["buckets"]
    if dn == 0:
        raise ValueError(f"caps {caps_mb} give the same bucket count ({big['buckets']}): no slope")
    return dict(between_steps_us_per_bucket=(small["between_steps_us"] - big["between_steps_us"]) / dn,
                background_us_per_bucket=(small["background_us_per_step"] - big["background_us_per_step"]) / dn,
                caps=caps, rounds=rounds, steps=steps, warmup_steps=warmup_steps, config=cfg.to_json_dict(),
                source=DIRECT_SOURCE)


IN_THREAD_SOURCE = ("measured: thread CPU time of the recorder path's own per-step work after backward "
                    "(LayoutBuckets.resolved + Telemetry.emit_many to a rank's event file) on the training thread, "
                    "1-rank gloo DDP in one process, median over steps; slope between two bucket caps")


def in_thread_cost(cfg: RunConfig, caps_mb: tuple[float, float] = (25.0, 0.01), steps: int = 300,
                   warmup_steps: int = 50) -> dict[str, Any]:
    """What `bucket_timing=recorder` itself runs on the training thread per step and per bucket
    (`IN_THREAD_SOURCE`): the part of its cost that block-by-block A/B cannot resolve on a noisy
    2-core machine (its intervals span ±0.2 ms a bucket there). Excludes what other threads and
    processes cost (the event writer, the launcher's follower): `bucket_cost` and `plain_alone`
    measure those with everything else. One rank process, started like the bench's plain ranks.

    Returns: per cap `buckets`, `wall_us` and `cpu_us` (medians a step), and `per_bucket_us` (CPU).
    Raises:
        ValueError: the two caps give the same bucket count (no slope to measure).
    """
    from ddpviz.engine.modes.ranks import start_rank_processes

    with tempfile.TemporaryDirectory(prefix="ddpviz-inthread-") as tmp:
        start_rank_processes(_in_thread_rank, (cfg.to_json_dict(), list(caps_mb), steps, tmp), 1)
        rows = json.loads(Path(tmp, "in_thread.json").read_text())
    for r in rows:
        r["wall_us"] = statistics.median(r.pop("wall_ns")[warmup_steps:]) / 1e3
        r["cpu_us"] = statistics.median(r.pop("cpu_ns")[warmup_steps:]) / 1e3
    big, small = rows
    if small["buckets"] == big["buckets"]:
        raise ValueError(f"caps {caps_mb} give the same bucket count ({big['buckets']}): no slope")
    return dict(caps=rows, per_bucket_us=(small["cpu_us"] - big["cpu_us"]) / (small["buckets"] - big["buckets"]),
                steps=steps, warmup_steps=warmup_steps, config=cfg.to_json_dict(), source=IN_THREAD_SOURCE)


def _in_thread_rank(rank: int, cfg_dict: dict, caps_mb: list[float], steps: int, out_dir: str) -> None:
    """`in_thread_cost`'s process: a 1-rank gloo group, a fresh model per cap, the rank's own loop's
    forward/backward, then the timed recorder work."""
    import time

    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddpviz.engine.components.training import loss_fn
    from ddpviz.engine.data import BatchPlan, load_dataset
    from ddpviz.engine.batching import rank_sink
    from ddpviz.engine.measure.telemetry import Telemetry
    from ddpviz.engine.models import build_model
    from ddpviz.engine.modes.ddp.buckets import ddp_bucket_cap_arg
    from ddpviz.engine.modes.ddp.reducer import LayoutBuckets
    from ddpviz.engine.modes.ranks import join_process_group, leave_process_group

    base = RunConfig(**{**cfg_dict, "world_size": 1})
    join_process_group("gloo", init_method=f"file://{out_dir}/pg", rank=0, world_size=1)
    try:
        ds, rows = load_dataset(base), []
        for cap in caps_mb:
            cfg = base.model_copy(update=dict(bucket_cap_mb=cap))
            model = build_model(cfg, ds).train()
            ddp = DDP(model, bucket_cap_mb=ddp_bucket_cap_arg(cfg))
            log = LayoutBuckets(ddp, {p.data_ptr(): n for n, p in model.named_parameters()})
            sink = rank_sink(Path(out_dir, f"events-{cap}.jsonl"))
            tel = Telemetry(sink, "in-thread", rank=0, device="cpu:0")
            plan = BatchPlan(len(ds), 1, cfg.micro_batch_per_device, cfg.seed)
            wall, cpu, n = [], [], 0
            for step in range(steps):
                idx = plan.rank_indices(step, 0)
                out = ddp(ds.x_train[idx])
                log.forward_returned()
                loss = loss_fn(out, ds.y_train[idx])
                log.begin_backward()
                loss.backward()
                w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
                buckets = log.resolved()
                tel.emit_many("bucket", buckets, step=step)
                wall.append(time.perf_counter_ns() - w0)
                cpu.append(time.thread_time_ns() - c0)
                n = len(buckets)
            sink.close()
            rows.append(dict(bucket_cap_mb=cap, buckets=n, wall_ns=wall, cpu_ns=cpu))
        Path(out_dir, "in_thread.json").write_text(json.dumps(rows))
    finally:
        leave_process_group()
