"""The memory timer: reads every device's cheap memory counters 20 times a second and publishes
the readings as they are taken.

A daemon thread reads, every `SAMPLE_INTERVAL_S`, per device: process RSS (psutil; `process`), the
CUDA caching allocator (`torch.cuda.memory_allocated`; `cuda`), NVML's used memory of the same GPU
by UUID (`nvml`), plus whatever its owner adds (`extra`: the live-tensor ledger while a step is
traced, `tensors`). Every `PUBLISH_INTERVAL_S` (and when it stops) it emits, per device, one
`memory_readings` event holding the `TIMER_SOURCES` readings taken since the last one, so a reading
reaches the run's events at most `PUBLISH_INTERVAL_S` plus one period after it was taken, whatever
the step length (docs/events.md). The readings also stay in memory (`DeviceProbe.readings`) for the
within-step curves of traced steps (`engine.measure.memory_sampler`).

Why batched: one event per reading per device would be 20 events/s/device on the stream; one per
half second carries the same readings in a tenth of the events.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ddpviz.engine.measure.memory import NvmlReader, process_rss_bytes
from ddpviz.engine.measure.own_threads import name_this_thread
from ddpviz.engine.measure.telemetry import Telemetry, now, wall_ts

SAMPLE_INTERVAL_S = 0.05  # timer period: 20 readings per second per device
PUBLISH_INTERVAL_S = 0.5  # readings wait at most this long (plus one period) before they are emitted
TIMER_SOURCES = ("process", "cuda", "nvml")  # what a `memory_readings` event carries (never the ledger)
READINGS_SOURCE = ("measured by a timer thread every interval_s: process = resident set size of the "
                   "process (psutil), cuda = torch.cuda.memory_allocated, nvml = NVML used memory of "
                   "the same GPU (by UUID)")
_RECENT_READINGS = 4096  # timer readings kept per device for the within-step curves (~200 s at 20 Hz)


@dataclass
class DeviceProbe:
    """One device the timer reads.

    Attributes:
        name: the event's `device` ("cpu:1", "cuda:0").
        ledger_index: this device's index in the ledger (None: no ledger figures).
        cuda_index: CUDA ordinal for allocator and NVML readings (None on CPU).
        process_shared: the process's RSS covers other devices too (DP's virtual devices).
    """

    name: str
    ledger_index: int | None = 0
    cuda_index: int | None = None
    process_shared: bool = False
    readings: deque = field(default_factory=lambda: deque(maxlen=_RECENT_READINGS))
    unpublished: list = field(default_factory=list)  # (perf_counter s, {source: bytes}) not yet emitted
    window_count: int = 0
    window_peak: dict[str, int] = field(default_factory=dict)


class MemoryTimer:
    """Reads `devices` on a timer and publishes the readings (`memory_readings` events).

    Args:
        tel: where events go (`rank` comes from it; `device` from each probe).
        devices: the devices to read.
        nvml: NVML reader (default: one when a device is CUDA).
        interval_s: timer period, seconds (> 0).
        publish_interval_s: seconds between two `memory_readings` events of a device (> 0).
        extra: probe -> more {source: bytes} for this reading (e.g. the ledger's total).

    Raises:
        ValueError: interval_s or publish_interval_s not > 0.

    Thread-safe: `tick` may also be called from the training thread (traced steps' start and end).
    Call `close()` when the run ends: it stops the thread and publishes the last readings.
    """

    def __init__(self, tel: Telemetry, devices: list[DeviceProbe], nvml: NvmlReader | None = None,
                 interval_s: float = SAMPLE_INTERVAL_S, publish_interval_s: float = PUBLISH_INTERVAL_S,
                 extra: Callable[[DeviceProbe], dict[str, int]] | None = None):
        if not interval_s > 0 or not publish_interval_s > 0:
            raise ValueError(f"interval_s and publish_interval_s must be > 0 (got {interval_s}, "
                             f"{publish_interval_s})")
        self.tel, self.devices, self.extra = tel, devices, extra
        self.interval_s, self.publish_interval_s = interval_s, publish_interval_s
        uses_cuda = any(p.cuda_index is not None for p in devices)
        self.nvml = nvml if nvml is not None else (NvmlReader() if uses_cuda else None)
        self.lock = threading.Lock()
        self._published_at = now()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ddpviz-memory-timer", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        name_this_thread()
        while not self._stop.wait(self.interval_s):
            self.tick()
            if now() - self._published_at >= self.publish_interval_s:
                self.publish()

    def read(self, probe: DeviceProbe, rss: int | None) -> dict[str, int]:
        """One reading of every source this device has, bytes by source."""
        out: dict[str, int] = {}
        if rss is not None:
            out["process"] = rss
        if probe.cuda_index is not None:
            out["cuda"] = int(torch.cuda.memory_allocated(probe.cuda_index))
            used = self.nvml.used_bytes(probe.cuda_index) if self.nvml else None
            if used is not None:
                out["nvml"] = used
        if self.extra is not None:
            out.update(self.extra(probe))
        return out

    def tick(self) -> float:
        """Read every device now; returns the reading's `now()` time."""
        rss = process_rss_bytes()
        with self.lock:  # the time is taken inside: readings stay in time order across threads
            t = now()
            for p in self.devices:
                r = self.read(p, rss)
                p.readings.append((t, r))
                p.unpublished.append((t, r))
                p.window_count += 1
                for src, b in r.items():
                    p.window_peak[src] = max(p.window_peak.get(src, 0), b)
        return t

    def publish(self) -> int:
        """Emit one `memory_readings` event per device with the readings not yet emitted; returns
        how many readings went out (all devices)."""
        with self.lock:
            self._published_at = now()
            batches = [(p, p.unpublished) for p in self.devices if p.unpublished]
            for p, _ in batches:
                p.unpublished = []
        for p, rows in batches:
            self.tel.emit("memory_readings", device=p.name, **readings_fields(rows, p.process_shared,
                                                                              self.interval_s))
        return sum(len(rows) for _, rows in batches)

    def close(self) -> None:
        """Stop the thread and publish what is left."""
        self._stop.set()
        self._thread.join(timeout=2)
        self.publish()


def readings_fields(rows: list[tuple[float, dict[str, int]]], process_shared: bool,
                    interval_s: float) -> dict[str, Any]:
    """A `memory_readings` event's fields from `(now() time, {source: bytes})` readings:
    `reading_ts` (unix s of each reading, to the µs: the timer and a traced step's own `tick` can read
    within 0.1 ms of each other), `bytes` ({source: one value per reading, null where that
    reading lacked the source}, `TIMER_SOURCES` only), `interval_s`, `process_shared`, `source`."""
    sources = [s for s in TIMER_SOURCES if any(s in r for _, r in rows)]
    return dict(reading_ts=[round(wall_ts(t), 6) for t, _ in rows],
                bytes={s: [r.get(s) for _, r in rows] for s in sources},
                interval_s=interval_s, process_shared=process_shared, source=READINGS_SOURCE)
