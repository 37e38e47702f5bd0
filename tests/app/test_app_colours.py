"""One colour per meaning across the app (issue 33.4): every colour scale every page draws takes its
colours from `app.charts.style`, and no colour means two things (a mode and a phase, a device and a
kind of bytes...), walked through every page's Vega-Lite specs on recorded real runs."""

from __future__ import annotations

import re

from test_app_chart_text import _built, _walk, specs  # noqa: F401 (the fixture)

from ddpviz.app.charts import style

ALIASES = {"backward (compute)": "backward", "all-reduce (a bar per bucket)": "all-reduce",
           "all-reduce began (end not measured)": "all-reduce",
           "waiting for the all-reduce": "exposed comm", "waiting for the GIL": "gil",
           # one series drawn on two charts (bandwidth, time)
           "probe all-reduce time (measured)": "probe", "probe busbw (measured)": "probe",
           # the topology's nodes in their mode's colours: DP's hub and replicas, DDP's ranks
           "hub (device 0)": "mode:dp", "replica (device 1..n−1)": "mode:dp", "rank": "mode:ddp",
           "all devices (one process)": "shared device"}
MODE_OF_SERIES = {"DP": "dp", "DDP": "ddp"}


def _registry() -> dict[str, set[str]]:
    """hex -> the meanings `app.charts.style` gives it."""
    out: dict[str, set[str]] = {}
    for mode, hues in style.MODE_HUES.items():
        for h in hues:
            out.setdefault(h, set()).add(f"mode:{mode}")
    for h in style.OTHER_RUN_COLOURS:
        out.setdefault(h, set()).add("run of no known mode")
    for i, h in enumerate(style.DEVICE_HUES):
        out.setdefault(h, set()).add(f"device:{i}")
    out.setdefault(style.GIL_COLOUR, set()).add("gil")
    out.setdefault(style.SHARED_DEVICE_COLOUR, set()).add("shared device")
    for family in (style.PHASE_HUES, style.VOLUME_COLOURS, style.THEORY_HUES, style.FSDP_HUES, style.SWEEP_HUES,
                   style.MEMORY_USE_HUES, style.THREAD_STATE_HUES, style.TUNE_HUES):
        for name, h in family.items():
            out.setdefault(h, set()).add(_meaning(name, {}))
    return out


def _meaning(value, modes: dict[str, str]) -> str:
    v = str(value)
    if v in modes:
        return f"mode:{modes[v]}"
    if v in style.MODE_HUES:
        return f"mode:{v}"
    head = v.split(" (")[0]
    if head in MODE_OF_SERIES:
        return f"mode:{MODE_OF_SERIES[head]}"
    if "GIL" in v:
        return "gil"
    m = re.fullmatch(r"(?:cpu|cuda|rank|device)[: ](\d+)", v)
    if m:
        return f"device:{int(m.group(1)) % len(style.DEVICE_HUES)}"
    return ALIASES.get(v, v)


def test_the_palette_gives_each_colour_one_meaning():
    shared = {h: m for h, m in _registry().items() if len(m) > 1}
    assert not shared, shared
    assert len({h.lower() for h in _registry()}) == len(_registry())


def test_every_page_colours_each_meaning_with_its_one_colour(specs):  # noqa: F811
    pages, modes = specs
    registry = _registry()
    meanings: dict[str, set[str]] = {}
    outside: list[str] = []
    checked = 0
    for page, spec, _ in pages + _built():
        for view in _walk(spec):
            colour = (view.get("encoding") or {}).get("color")
            scale = colour.get("scale") if isinstance(colour, dict) else None
            if not isinstance(scale, dict) or not isinstance(scale.get("range"), list):
                continue
            for value, hue in zip(scale.get("domain") or [], scale["range"]):
                if value == "":  # an empty chart's placeholder domain
                    continue
                checked += 1
                meanings.setdefault(hue.lower(), set()).add(_meaning(value, modes))
                if hue.lower() not in {h.lower() for h in registry}:
                    outside.append(f"{page}: {value} drawn {hue}, a colour app.charts.style does not name")
    assert checked > 60, checked
    assert not outside, "\n".join(sorted(set(outside)))
    # a second run of a mode takes a shade of it: still its mode
    twice = {h: m for h, m in meanings.items() if len(m) > 1}
    assert not twice, twice
