"""Pure transforms: lists of run events (docs/events.md) -> pandas DataFrames the charts draw.

Every function takes plain event dicts and returns a DataFrame with unit-named columns
(`*_ms` milliseconds, `*_mib` MiB, `samples_per_s` samples per second). No Streamlit, no I/O.
An empty input gives an empty frame with the same columns, so charts never see missing fields.
"""

from __future__ import annotations

from typing import Any, Iterable

MIB = 1024 * 1024
Event = dict[str, Any]


def of_type(events: Iterable[Event], type_: str) -> list[Event]:
    """The events whose `type` is `type_`, in order."""
    return [e for e in events if e.get("type") == type_]


def latest_volumes(events: Iterable[Event]) -> list[Event]:
    """The newest `comm_volume` event of each place (rank and device), by rank then device. A launched
    DDP rank emits one on its traced steps and when its bucket sizes change (docs/events.md), so ranks
    whose sizes differ (a sparse bucket holds each rank's own rows) can report on different steps: the
    latest step of all would show only some of them."""
    latest: dict[tuple, Event] = {}
    for e in of_type(events, "comm_volume"):
        place = (e.get("rank", 0), str(e.get("device")))
        if place not in latest or e["step"] >= latest[place]["step"]:
            latest[place] = e
    return [latest[k] for k in sorted(latest)]


def run_label(run: dict[str, Any] | None, run_id: str) -> str:
    """Short legend name of a run: its label if set, else ``"<mode> ×<world_size> · <id[:6]>"``."""
    run = run or {}
    if run.get("label"):
        return str(run["label"])
    cfg = run.get("config") or {}
    mode, ws = cfg.get("mode", "?"), cfg.get("world_size", "?")
    return f"{mode} ×{ws} · {run_id[:6]}"


def mib(nbytes: float | None) -> float:
    return float("nan") if nbytes is None else nbytes / MIB


# The one home of how a size or a rate is written: the unit that keeps the number readable
# (a 20-parameter model's 84 B gradients are "84 B", not "0.00 MiB").
BYTE_UNITS = [("B", 1), ("KiB", 1024), ("MiB", MIB), ("GiB", 1024 * MIB)]  # binary, as PyTorch's memory stats
RATE_UNITS = [("B/s", 1), ("kB/s", 1e3), ("MB/s", 1e6), ("GB/s", 1e9)]  # decimal, as NCCL's algbw and busbw


def byte_unit(nbytes: float | None) -> tuple[str, float]:
    """(name, bytes in one) of the largest binary unit (B, KiB, MiB, GiB) not above `nbytes`;
    B for 0, None or NaN. Pick it once for a whole axis from the largest value on it."""
    return _unit(nbytes, BYTE_UNITS)


def format_bytes(nbytes: float | None) -> str:
    """`nbytes` with three significant figures in the unit `byte_unit` picks: "84 B", "3.39 KiB",
    "548 KiB", "25.0 MiB", "1.20 GiB"; "n/a" for None or NaN."""
    return _format(nbytes, BYTE_UNITS)


def format_rate(bytes_per_s: float | None) -> str:
    """A bandwidth in bytes/s, in decimal units (B/s, kB/s, MB/s, GB/s), three significant figures."""
    return _format(bytes_per_s, RATE_UNITS)


def _unit(value: float | None, units: list[tuple[str, float]]) -> tuple[str, float]:
    if value is None or value != value or value <= 0:
        return units[0]
    return [u for u in units if u[1] <= abs(value)][-1] if abs(value) >= 1 else units[0]


def _format(value: float | None, units: list[tuple[str, float]]) -> str:
    if value is None or value != value:
        return "n/a"
    name, size = _unit(value, units)
    v = value / size
    if size == 1 and float(v).is_integer():
        return f"{int(v)} {name}"
    digits = 0 if abs(v) >= 100 else 1 if abs(v) >= 10 else 2  # three significant figures, never "1e+03"
    return f"{v:,.{digits}f} {name}"


def latest_complete_step(events: Iterable[Event], type_: str) -> int | None:
    """Newest step whose `type_` events look complete for every rank/device seen in it.

    Events arrive in batches, so the newest step may be half there. A `bucket` step is complete
    when each of its ranks has sent its `is_last` bucket; a `dp_phase` step when each device has
    sent its `optimizer` phase (device 0 only steps in DP, so: when any device has). Falls back to
    the newest step seen when none is complete.
    """
    evs = of_type(events, type_)
    if not evs:
        return None
    by_step: dict[int, list[Event]] = {}
    for e in evs:
        by_step.setdefault(e["step"], []).append(e)
    for step in sorted(by_step, reverse=True):
        if _complete(by_step[step], type_):
            return step
    return max(by_step)


def _complete(evs: list[Event], type_: str) -> bool:
    if type_ == "bucket":
        ranks = {e.get("rank", 0) for e in evs}
        done = {e.get("rank", 0) for e in evs if e.get("is_last")}
        return ranks == done
    if type_ == "dp_phase":
        return any(e.get("phase") == "optimizer" for e in evs)
    return True


