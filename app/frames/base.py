"""Pure transforms: lists of run events (docs/events.md) -> pandas DataFrames the charts draw.

Every function takes plain event dicts and returns a DataFrame with unit-named columns
(`*_ms` milliseconds, `*_mib` MiB, `samples_per_s` samples per second). No Streamlit, no I/O.
An empty input gives an empty frame with the same columns, so charts never see missing fields.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

from ddpviz.engine.config import devices_used  # noqa: F401  (frames.devices_used: the pages' name for it)

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
    """Short legend name of a run: its label if set, else ``"<mode> ×<devices> · <id[:6]>"`` (`devices_used`)."""
    run = run or {}
    if run.get("label"):
        return str(run["label"])
    cfg = run.get("config") or {}
    if "mode" not in cfg and cfg.get("attached"):  # no rank started: what ran is the command, not a mode
        script = next((a for a in cfg.get("command") or [] if a.endswith(".py")), None)
        return f"{script or 'attached'} · {run_id[:6]}"
    return f"{cfg.get('mode', '?')} ×{devices_used(cfg) or '?'} · {run_id[:6]}"


def mib(nbytes: float | None) -> float:
    return float("nan") if nbytes is None else nbytes / MIB


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




def device_order(names: Iterable[Any]) -> list[str]:
    """Device names in numeric order ("cpu:2" before "cpu:10"; "cuda:0" after every "cpu:*"), each once: Vega
    and `sorted` order them as text, and a 64-device DP run's lanes and legends read cpu:0, cpu:1, cpu:10, ...
    (a new user, 2026-12-06)."""
    def key(name: str) -> list:
        return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name) if part]
    return sorted({str(n) for n in names}, key=key)
