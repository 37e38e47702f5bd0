"""Bounded memory under a flood of events: Redis stays flat once a run's stream reaches its cap
(``XADD MAXLEN ~``), and so does the app's reader (`app.window.RunWindow`, bounded windows).

A producer process writes DDP-shaped events through the real stream writer as fast as it is
allowed, until it has written a fixed number of events (not for a fixed time: a slow or busy machine
writes the same flood, only later); this process follows them as the Live page does. The short version always runs; the
compressed soak (a few minutes, the default cap) runs with ``DDPVIZ_SOAK=1`` (``-m soak``).
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import time
import tracemalloc

import pytest
from wmeasure import record
from wtools import cli_env

from ddpviz.workers import keys
from ddpviz.workers.client import DdpvizClient
from ddpviz.workers.connection import EmbeddedRedis
from ddpviz.workers.sink import DEFAULT_STREAM_MAXLEN
from ddpviz.workers.store import RunStore

PRODUCER = textwrap.dedent("""
    import sys, time
    from ddpviz import workers
    from ddpviz.engine.events import make_event
    from ddpviz.engine.batching import BatchingSink
    from ddpviz.workers.connection import connect
    from ddpviz.workers.sink import RedisStreamWriter
    url, run_id, maxlen, rate, total = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
    sink = BatchingSink(RedisStreamWriter(connect(url), run_id, maxlen), flush_interval_s=0.05)
    names = [f"layers.{i}.weight" for i in range(8)]
    t0, n, step = time.monotonic(), 0, 0
    while n < total:
        for rank in (0, 1):
            sink.emit(make_event("step", run_id, rank=rank, step=step, loss=1.0 / (step + 1),
                                 samples=64, step_time_s=0.01, forward_s=0.003, backward_s=0.005,
                                 comm_exposed_s=0.001, optimizer_s=0.001, samples_per_s=6400.0))
            for b in range(4):
                sink.emit(make_event("bucket", run_id, rank=rank, step=step, bucket_index=b,
                                     nbytes=1 << 20, num_params=2, ready_s=0.001 * b,
                                     comm_start_s=0.001 * b, comm_end_s=0.002 * b + 0.001,
                                     is_last=b == 3, param_names=names[2 * b:2 * b + 2] if step < 2 else None))
            sink.emit(make_event("memory", run_id, rank=rank, step=step, device=f"cpu:{rank}",
                                 allocated_bytes=123456789, reserved_bytes=0, used_bytes=None,
                                 source="accounted", breakdown={"params": 1, "grads": 2}))
            sink.emit(make_event("comm_volume", run_id, rank=rank, step=step, device=f"cpu:{rank}",
                                 sent_bytes=4 << 20, recv_bytes=4 << 20, theory_sent_bytes=4 << 20,
                                 theory_recv_bytes=4 << 20))
        n += 14
        step += 1
        ahead = n / rate - (time.monotonic() - t0)
        if ahead > 0:
            time.sleep(ahead)
    sink.close()
    print(n, time.monotonic() - t0)
""")


def soak(tmp_path, events: int, rate: float, maxlen: int) -> dict[str, float]:
    """Flood one run's stream with `events` events at up to `rate` events/s (cap `maxlen`) while
    reading it with a RunWindow; returns the measurements. "Steady" is every sample taken once the
    stream had reached 90% of its cap."""
    from ddpviz.app.window import RunWindow

    with EmbeddedRedis(tmp_path / "redis", persist=False) as server:
        client = DdpvizClient(url=server.url)
        RunStore(client.redis).create("soak", {"mode": "ddp", "world_size": 2, "steps": 10**6})
        base_used = client.redis.info("memory")["used_memory"]
        producer = subprocess.Popen([sys.executable, "-c", PRODUCER, server.url, "soak",
                                     str(maxlen), str(rate), str(events)],
                                    env=cli_env(server.url), stdout=subprocess.PIPE, text=True)
        window = RunWindow("soak", max_steps=500)
        tracemalloc.start()
        samples = []  # (t, redis used bytes, reader bytes, stream length)
        t0 = time.monotonic()
        try:
            while producer.poll() is None:
                window.poll(client)
                gc.collect()  # what the reader keeps, not the garbage of its last read
                samples.append((time.monotonic() - t0, client.redis.info("memory")["used_memory"],
                                tracemalloc.get_traced_memory()[0], client.redis.xlen(keys.events("soak"))))
                time.sleep(0.25)
        finally:
            tracemalloc.stop()
            out, _ = producer.communicate(timeout=60)
        written, wall = out.split()
    full = next(i for i, s in enumerate(samples) if s[3] >= 0.9 * maxlen)
    steady = samples[full:]
    return {
        "events": int(written), "events_per_s": int(written) / float(wall),
        "redis_base_bytes": base_used,
        "redis_steady_min_bytes": min(s[1] for s in steady),
        "redis_steady_max_bytes": max(s[1] for s in steady),
        "reader_steady_min_bytes": min(s[2] for s in steady),
        "reader_steady_max_bytes": max(s[2] for s in steady),
        "stream_max_len": max(s[3] for s in samples), "window_steps": len(window.of_type("step")),
    }


def _report(prefix: str, m: dict[str, float]) -> None:
    record(f"{prefix}_events_per_s", m["events_per_s"], "events/s")
    record(f"{prefix}_events", m["events"], "events")
    record(f"{prefix}_redis_used_steady_mb", m["redis_steady_max_bytes"] / 2**20, "MiB")
    record(f"{prefix}_redis_growth_steady_mb",
           (m["redis_steady_max_bytes"] - m["redis_steady_min_bytes"]) / 2**20, "MiB")
    record(f"{prefix}_reader_growth_steady_mb",
           (m["reader_steady_max_bytes"] - m["reader_steady_min_bytes"]) / 2**20, "MiB")
    record(f"{prefix}_stream_max_len", m["stream_max_len"], "entries")


def test_a_flood_of_events_keeps_redis_and_the_reader_bounded(tmp_path):
    maxlen = 5_000
    m = soak(tmp_path, events=6 * maxlen, rate=3_000, maxlen=maxlen)
    _report("soak_short", m)
    assert m["events"] > 4 * maxlen  # the cap was hit several times over
    assert m["stream_max_len"] <= maxlen + 200  # MAXLEN ~ trims whole nodes of 100 entries
    assert m["redis_steady_max_bytes"] - m["redis_base_bytes"] < 16 * 2**20
    assert m["redis_steady_max_bytes"] - m["redis_steady_min_bytes"] < 3 * 2**20
    assert m["reader_steady_max_bytes"] - m["reader_steady_min_bytes"] < 3 * 2**20
    assert m["window_steps"] <= 2 * 500  # two ranks, max_steps each


@pytest.mark.soak
@pytest.mark.skipif(os.environ.get("DDPVIZ_SOAK") != "1", reason="the soak runs with DDPVIZ_SOAK=1")
def test_soak_minutes_of_events_keep_memory_flat(tmp_path):
    seconds = float(os.environ.get("DDPVIZ_SOAK_S", "150"))
    m = soak(tmp_path, events=int(seconds * 5_000), rate=5_000, maxlen=DEFAULT_STREAM_MAXLEN)
    _report("soak_long", m)
    assert m["stream_max_len"] <= DEFAULT_STREAM_MAXLEN + 200
    assert m["redis_steady_max_bytes"] - m["redis_steady_min_bytes"] < 0.1 * m["redis_steady_max_bytes"]
    assert m["reader_steady_max_bytes"] - m["reader_steady_min_bytes"] < 4 * 2**20
