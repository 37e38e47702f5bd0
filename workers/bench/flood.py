"""Figure 3: events per second one run pushes through the real path, every event accounted for.

The path is the one a DDP run's events take: each rank process emits through its own
`engine.batching.rank_sink` (a background thread appending JSON lines to the rank's file), the
launcher's follower (`engine.modes.launcher.RankFollower`) tails the files and hands each event to the
engine's summary builder and to the worker's sink (`workers.sink.run_sink`: a BatchingSink over
a `RedisStreamWriter`), which appends to the run's Redis stream. Only the ranks are stand-ins:
two spawned processes that emit a DDP step's event mix (a `step`, three `bucket`s and a
`comm_volume` per rank and step), each event tagged with its rank and a sequence number `seq`,
paced to an offered rate. Afterwards the whole stream is read back and every (rank, seq) must be
there exactly once.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable

from ddpviz.workers import keys

PACE_TICK_S = 0.01  # the stand-in ranks emit in bursts this often
STEP_WRAP = 1000  # step numbers wrap here, so the summary builder holds what a 1,000-step run does
READ_CHUNK = 20_000  # entries per XRANGE when reading the stream back
FLOOD_RANKS = 2


def flood_events(run_id: str, rank: int, seq0: int, n: int, now: float) -> list[dict[str, Any]]:
    """`n` events of a DDP step's mix for `rank`, numbered `seq0..seq0+n-1` (5 events per step)."""
    out = []
    for seq in range(seq0, seq0 + n):
        step, kind = (seq // 5) % STEP_WRAP, seq % 5
        base = {"run_id": run_id, "ts": now, "rank": rank, "device": f"cpu:{rank}", "step": step,
                "seq": seq}
        if kind == 0:
            out.append({"type": "step", **base, "loss": 2.302585, "samples": 64,
                        "step_time_s": 0.0015, "forward_s": 0.0004, "backward_s": 0.0006,
                        "comm_exposed_s": 0.0001, "optimizer_s": 0.0002,
                        "samples_per_s": 42666.7, "start_ts": now - 0.0015,
                        "backward_start_ts": now - 0.001})
        elif kind < 4:
            b = kind - 1
            out.append({"type": "bucket", **base, "bucket_index": b, "nbytes": 40960 * (b + 1),
                        "num_params": 2, "ready_s": 0.0002 * (b + 1),
                        "comm_start_s": 0.0002 * (b + 1) + 1e-5,
                        "comm_end_s": 0.0002 * (b + 1) + 0.0003, "is_last": b == 2})
        else:
            out.append({"type": "comm_volume", **base, "sent_bytes": 122880,
                        "recv_bytes": 122880, "theory_sent_bytes": 122880,
                        "theory_recv_bytes": 122880})
    return out


def flood_rank(workdir: str, local: int, run_id: str, rate_per_s: float, duration_s: float) -> None:
    """A stand-in rank process: emits `rate_per_s` events/s for `duration_s` through the rank's
    own sink, then writes ``flood<local>.json`` = {emitted, first_emit_ts, last_emit_ts}."""
    from ddpviz.engine.batching import rank_sink

    wd = Path(workdir)
    sink = rank_sink(wd / f"local{local}.jsonl")
    per_tick = max(1, round(rate_per_s * PACE_TICK_S))
    t0 = time.time()
    seq = 0
    while True:
        due = t0 + (seq / per_tick) * PACE_TICK_S
        now = time.time()
        if now - t0 >= duration_s:
            break
        if due > now:
            time.sleep(due - now)
        # stamped with the time the burst was due, not when it went out: a rank that falls
        # behind its pace (the 2 cores busy) shows in the backlog too
        for e in flood_events(run_id, local, seq, per_tick, due):
            sink.emit(e)
        seq += per_tick
    last = time.time()
    sink.close()
    (wd / f"flood{local}.json").write_text(json.dumps(
        {"emitted": seq, "first_emit_ts": t0, "last_emit_ts": last}))


def account(seqs: Iterable[tuple[int, int]], emitted: dict[int, int]) -> dict[str, Any]:
    """Which events arrived: (rank, seq) pairs read from the stream against how many each rank
    emitted (seq 0..emitted-1).

    Returns:
        {emitted, stored, lost, duplicated, foreign}: `lost` = emitted pairs never seen,
        `duplicated` = extra copies, `foreign` = pairs no rank emitted.
    """
    seen: dict[int, bytearray] = {r: bytearray(n) for r, n in emitted.items()}
    stored = duplicated = foreign = 0
    for rank, seq in seqs:
        stored += 1
        marks = seen.get(rank)
        if marks is None or not 0 <= seq < len(marks):
            foreign += 1
        elif marks[seq]:
            duplicated += 1
        else:
            marks[seq] = 1
    total = sum(emitted.values())
    lost = sum(len(m) - sum(m) for m in seen.values())
    return {"emitted": total, "stored": stored, "lost": lost, "duplicated": duplicated,
            "foreign": foreign}


def per_second_rates(arrivals_ms: list[int], start_ms: int, end_ms: int) -> list[int]:
    """Entries that arrived in each whole second of [start_ms, end_ms)."""
    n = max(0, (end_ms - start_ms) // 1000)
    bins = [0] * n
    for a in arrivals_ms:
        i = (a - start_ms) // 1000
        if 0 <= i < n:
            bins[i] += 1
    return bins


def read_back(redis, run_id: str) -> tuple[list[tuple[int, int]], list[int], list[float]]:
    """(rank, seq) of every entry of the run's stream, its arrival ms (the stream id's ms, Redis's
    clock) and the time it was offered (the event's ``ts``, s: when its burst was due at the
    offered rate, on the rank's clock: the same host), oldest first."""
    from ddpviz.workers.bench.latency import arrival_ms

    pairs, arrivals, emitted, after = [], [], [], "-"
    while True:
        entries = redis.xrange(keys.events(run_id), min=after, max="+", count=READ_CHUNK)
        for entry_id, fields in entries:
            e = json.loads(fields[keys.EVENT_FIELD])
            pairs.append((e.get("rank"), e.get("seq")))
            arrivals.append(arrival_ms(entry_id))
            emitted.append(e.get("ts") or 0.0)
        if len(entries) < READ_CHUNK:
            return pairs, arrivals, emitted
        after = "(" + entries[-1][0].decode()


def lag_ms(arrivals_ms: list[int], emitted_s: list[float]) -> dict[str, float | None]:
    """p50/p99/max of arrival − offered time (ms) over all events: how far behind the path ran
    (the stand-in ranks' own lag included). A path that sustains the offered rate keeps this
    bounded; one that cannot sees it grow all run."""
    lags = sorted(a - e * 1000 for a, e in zip(arrivals_ms, emitted_s))
    if not lags:
        return {"p50": None, "p99": None, "max": None}
    pick = lambda q: round(lags[min(len(lags) - 1, int(q * len(lags)))], 1)  # noqa: E731
    return {"p50": pick(0.5), "p99": pick(0.99), "max": round(lags[-1], 1)}


class _Observed:
    """The engine's forwarding wrapper (engine.runner): summary builder first, then the sink."""

    def __init__(self, sink, builder):
        self.sink, self.builder = sink, builder

    def emit(self, event: dict[str, Any]) -> None:
        self.builder.observe(event)
        self.sink.emit(event)


def measure_flood(redis, rate_per_s: float, duration_s: float) -> dict[str, Any]:
    """Figure 3: offer `rate_per_s` events/s (all ranks together) for `duration_s` seconds.

    Returns:
        {offered_per_s, duration_s, delivered_per_s (events stored / first emit to last arrival),
        sustained_min_per_s (slowest whole second while the ranks emitted; `per_second` holds
        every second's count), lag_ms ({p50, p99, max} of arrival − emit: the backlog),
        drain_s (last arrival after the ranks stopped), redis_bytes_per_event, emitted, stored,
        lost, duplicated, foreign}.
    """
    from ddpviz.engine.modes.launcher import RankFollower
    from ddpviz.engine.summary import SummaryBuilder
    from ddpviz.workers.sink import run_sink

    run_id = f"bench-flood-{int(time.time())}"
    redis.delete(keys.events(run_id))
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="ddpviz-flood-") as wd:
        sink, writer = run_sink(redis, run_id, maxlen=10 ** 9)  # nothing trimmed: all is checked
        follower = RankFollower(Path(wd), FLOOD_RANKS, _Observed(sink, SummaryBuilder()), None)
        follower.start()
        procs = [ctx.Process(target=flood_rank, args=(wd, r, run_id, rate_per_s / FLOOD_RANKS,
                                                      duration_s)) for r in range(FLOOD_RANKS)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        follower.finish()
        sink.close()
        ranks = [json.loads((Path(wd) / f"flood{r}.json").read_text()) for r in range(FLOOD_RANKS)]
    pairs, arrivals, emitted = read_back(redis, run_id)
    used = redis.memory_usage(keys.events(run_id), samples=0) or 0
    redis.delete(keys.events(run_id))
    first_ms = int(min(r["first_emit_ts"] for r in ranks) * 1000)
    stop_ms = int(max(r["last_emit_ts"] for r in ranks) * 1000)
    last_ms = max(arrivals, default=first_ms)
    bins = per_second_rates(arrivals, first_ms, stop_ms)
    acc = account(pairs, {r: ranks[r]["emitted"] for r in range(FLOOD_RANKS)})
    return {"offered_per_s": rate_per_s, "duration_s": duration_s, "ranks": FLOOD_RANKS,
            "delivered_per_s": round(acc["stored"] / max(1e-9, (last_ms - first_ms) / 1000)),
            "sustained_min_per_s": min(bins[1:-1] or bins or [0]),
            "drain_s": round(max(0, last_ms - stop_ms) / 1000, 3),
            "redis_bytes_per_event": round(used / max(1, len(pairs))), "per_second": bins,
            "lag_ms": lag_ms(arrivals, emitted), **acc}
