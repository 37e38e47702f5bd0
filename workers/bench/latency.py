"""Figure 1: how long a `step` event takes from the end of its step to its arrival in Redis.

Clocks: a step event carries `start_ts` and `step_time_s`, so its step ended at
``start_ts + step_time_s`` (unix seconds, from the rank's `time.time()` offset, see
`engine.measure.telemetry.wall_ts`). Redis stamps each stream entry with its own clock: an auto-generated
entry id is ``<unix ms>-<seq>`` (https://redis.io/docs/latest/develop/data-types/streams/#entry-ids),
so the id's first part is the arrival time in ms. The rank, the worker and Redis run on one host
here, so both readings come from the same system clock; the id's 1 ms resolution bounds the error.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np


def arrival_ms(entry_id: bytes | str) -> int:
    """Unix milliseconds at which Redis added the entry (the first part of its auto id).

    Raises:
        ValueError: `entry_id` is not ``<ms>-<seq>``.
    """
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms, sep, seq = text.partition("-")
    if not sep or not ms.isdigit() or not seq.isdigit():
        raise ValueError(f"entry_id must be '<ms>-<seq>' (got {text!r})")
    return int(ms)


def step_end_ts(event: dict[str, Any]) -> float | None:
    """Unix seconds at which a `step` event's step ended, or None when the event lacks the fields."""
    start, dur = event.get("start_ts"), event.get("step_time_s")
    if not isinstance(start, (int, float)) or not isinstance(dur, (int, float)):
        return None
    return float(start) + float(dur)


def step_latencies_ms(entries: Iterable[tuple[bytes | str, dict[str, Any]]]) -> list[float]:
    """Arrival minus step end, in ms, for every `step` event among (entry id, event) pairs.

    Other event types and step events without `start_ts`/`step_time_s` are skipped.
    """
    out = []
    for entry_id, event in entries:
        if event.get("type") != "step":
            continue
        end = step_end_ts(event)
        if end is not None:
            out.append(arrival_ms(entry_id) - end * 1000.0)
    return out


def distribution(values_ms: list[float]) -> dict[str, float | int | None]:
    """``{n, p50_ms, p95_ms, max_ms}`` (numpy's linear-interpolation percentiles); Nones when empty."""
    if not values_ms:
        return {"n": 0, "p50_ms": None, "p95_ms": None, "max_ms": None}
    a = np.asarray(values_ms, dtype=float)
    return {"n": int(a.size), "p50_ms": float(np.percentile(a, 50)),
            "p95_ms": float(np.percentile(a, 95)), "max_ms": float(a.max())}


def summarize(values_ms: list[float]) -> dict[str, Any]:
    """`distribution` rounded to 0.1 ms for the report."""
    d = distribution(values_ms)
    return {k: (round(v, 1) if isinstance(v, float) and math.isfinite(v) else v) for k, v in d.items()}
