"""Every chart the pages draw, walked through its Vega-Lite spec, on recorded real runs: no legend
label, legend title, axis label or title line is longer than the room Vega gives it (Vega cuts
it with "…" there), and every chart coloured by mode uses the app's one mode colour map.

Text widths are estimates (generous ones for labels and titles: 6.5 px a character at 11 px, 7.7
at 13 px bold; a subtitle's 5.3 px as measured), so a failure is a line that would be cut, or close.
The room: a legend's or axis's `labelLimit` (Vega's defaults 160 and 180 px where unset), a
legend's `titleLimit` (180 px), and a chart title's plot width, which Vega uses as its limit: the
narrowest chart the pages draw is half of a page column at 1024 px, so `TITLE_ROOM_PX`. A legend
above or below the plot lays its entries side by side (`columns` of them a row): a row must fit
the chart's width (`ROW_ROOM_PX`, at 1280 px), or its last entries fall off the chart's edge.
"""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pytest
import redis
from recorded import CONFIG, overlap_pair, trio

PX_PER_CHAR = {11: 6.5, 13: 7.7}  # Vega's default sans-serif, generous (digits and capitals)
SUBTITLE_PX_PER_CHAR = 5.3  # a subtitle line's characters, as measured in Chromium screenshots
LEGEND_LABEL_LIMIT, LEGEND_TITLE_LIMIT, AXIS_LABEL_LIMIT = 160, 180, 180  # Vega's defaults (px)
TITLE_ROOM_PX = 320  # a half-column chart's plot at 1024 px wide, less its y axis
LEGEND_SYMBOL_PX = 26  # a legend entry's symbol and the gaps around it
ROW_PX_PER_CHAR = 5.6  # a legend label's characters, as measured in the screenshots (10 px labels)
ROW_ROOM_PX = 380  # a half-column chart's whole width at 1280 px: a legend row may use all of it
FULL_WIDTH_PX = 760  # the charts the pages draw across the whole column (titles starting so)
FULL_WIDTH = ("The lock", "DP: step", "Shards, gather, scatter")
PAGES = ["views/live.py", "views/compare.py", "views/buckets.py", "views/dp_timeline.py",
         "views/theory.py", "views/learn.py", "views/scaleout.py", "views/runs.py", "views/sweeps.py",
         "views/cluster.py"]


def _px(text: str, size: int = 11) -> float:
    return len(str(text)) * PX_PER_CHAR[size]


def _table(proto) -> dict[str, list]:
    """Columns of a Streamlit chart's dataset (Arrow IPC bytes)."""
    return pa.ipc.open_stream(io.BytesIO(proto.data)).read_all().to_pydict() if proto.data else {}


@pytest.fixture(scope="module")
def specs(redis_url):
    """(page, spec, {dataset name: columns}) of every chart every page draws, on a recorded
    single/DP/DDP/FSDP set (DDP with its all-reduce probe) and a DDP overlap on/off pair."""
    import ddpviz.app.connection
    from ddpviz import app  # noqa: E402
    from streamlit.testing.v1 import AppTest
    from stack import ROOT
    from ddpviz.workers.client import DdpvizClient
    from ddpviz.workers.connection import connect

    r = connect(redis_url)
    r.flushdb()
    mp = pytest.MonkeyPatch()
    mp.setenv("REDIS_URL", redis_url)
    app.connection._client.clear()
    client = DdpvizClient(redis=r)
    try:
        from recorded import play

        from ddpviz.workers.sweeps import submit_sweep

        sweep = submit_sweep(client, CONFIG, "world_size", [2])  # Sweeps' charts coloured by mode
        for run in client.list_runs():
            play(client, run["run_id"], f"real_{run['config']['mode']}_mlp_ws2.jsonl")
        _, ids = trio(client, ddp="ddp-probe")
        overlap_pair(client)
        out = []
        for page in PAGES:
            query = {"runs": f"{ids['dp']},{ids['ddp']}"} if page.endswith("live.py") else {}
            at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=60)
            at.query_params.update(query)
            at.run()
            at.switch_page(page).run()
            assert not at.exception, (page, [e.value for e in at.exception])
            out += _charts(page, at)
            if page.endswith("sweeps.py"):  # the newest sweep is the overlap pair: the other one too
                at.selectbox(key="sweep_pick").set_value(sweep).run()
                out += _charts(page, at)
        assert len(out) > 20
        modes = {r.get("label"): r["config"]["mode"] for r in client.list_runs() if r.get("label")}
        return out, modes
    finally:
        r.flushdb()
        app.connection._client.clear()
        mp.undo()


def _charts(page: str, at) -> list[tuple[str, dict, dict]]:
    out = []
    for c in at.get("vega_lite_chart"):
        data = {d.name: _table(d.data) for d in c.proto.datasets}
        if c.proto.data.data:
            data[""] = _table(c.proto.data)
        out.append((page, json.loads(c.proto.spec), data))
    return out


def _walk(spec: dict):
    """Every view (a spec with `encoding`) in a layered/concatenated/faceted spec, with the
    dataset names it can read."""
    yield spec
    for key in ("layer", "hconcat", "vconcat", "concat"):
        for sub in spec.get(key, []):
            yield from _walk(sub)
    if "spec" in spec:
        yield from _walk(spec["spec"])


def _values(field: str, data: dict) -> set:
    return {v for cols in data.values() for v in cols.get(field, []) if v is not None}


def _lines(text) -> list[str]:
    if text is None:
        return []
    return [str(t) for t in text] if isinstance(text, list) else [str(text)]


def _cut(specs) -> list[str]:
    cut = []
    for page, spec, data in specs:
        title = spec.get("title") or {}
        title = {"text": title} if isinstance(title, (str, list)) else title
        name = " / ".join(_lines(title.get("text")))[:60]
        limit = title.get("limit") or TITLE_ROOM_PX
        cut += [f"{page} '{name}': title line '{t}'" for t in _lines(title.get("text")) if _px(t, 13) > limit]
        cut += [f"{page} '{name}': subtitle line '{t}'" for t in _lines(title.get("subtitle"))
                if len(t) * SUBTITLE_PX_PER_CHAR > limit]
        for view in _walk(spec):
            for channel, enc in (view.get("encoding") or {}).items():
                if not isinstance(enc, dict):
                    continue
                shown = set((enc.get("scale") or {}).get("domain") or []) if isinstance(
                    (enc.get("scale") or {}).get("domain"), list) else set()
                if enc.get("type") == "nominal" and "field" in enc:
                    shown |= _values(enc["field"], data)
                leg = enc.get("legend", {}) if channel in ("color", "shape", "strokeDash", "size", "opacity") else None
                if isinstance(leg, dict):
                    label_limit = leg.get("labelLimit", LEGEND_LABEL_LIMIT) or 1e9
                    cut += [f"{page} '{name}': {channel} legend label '{v}'" for v in shown
                            if _px(v) > label_limit]
                    if leg.get("title") and _px(leg["title"]) > (leg.get("titleLimit", LEGEND_TITLE_LIMIT) or 1e9):
                        cut += [f"{page} '{name}': legend title '{leg['title']}'"]
                    if leg.get("orient") in ("top", "bottom") and leg.get("direction") != "vertical" and shown:
                        entry = [len(str(v)) * ROW_PX_PER_CHAR + LEGEND_SYMBOL_PX for v in shown]
                        cols = leg.get("columns") or len(entry)  # Vega sizes each column to its widest
                        row = sum(max(entry[j::cols]) for j in range(min(cols, len(entry))))
                        if row > (FULL_WIDTH_PX if name.startswith(FULL_WIDTH) else ROW_ROOM_PX):
                            cut += [f"{page} '{name}': {channel} legend row of {len(entry)} entries, ~{row:.0f} px"]
                axis = enc.get("axis", {}) if channel in ("x", "y") else None
                if axis is not None and enc.get("type") == "nominal":
                    axis_limit = axis.get("labelLimit", AXIS_LABEL_LIMIT) or 1e9
                    cut += [f"{page} '{name}': {channel} axis label '{v}'" for v in shown if _px(v) > axis_limit]
    return sorted(set(cut))


def _built() -> list[tuple[str, dict, dict]]:
    """Charts the recordings do not reach (no thread states, no memory timer in them), built
    from their frames with run labels as long as a labelled run's (`mlp-deep · DP · c…`)."""
    from ddpviz.app.charts import dp as charts_dp
    from ddpviz.app.charts import memory as charts_memory
    from ddpviz.app.frames import dp as fd
    from ddpviz.app.frames import memory as fm
    from ddpviz.app.step_history import ReadingHistory

    label = "mlp-deep · DP · config 3"
    gil = [{"type": "gil", "step": s, "device": d, "on_cpu_s": 0.004, "gil_wait_s": 0.002,
            "runnable_s": 0.001, "thread_wait_s": 0.001, "other_wait_s": 0.0}
           for s in range(3) for d in ("cpu:0", "cpu:1")]
    h = ReadingHistory(bin_s=1.0)
    h.add({"type": "memory_readings", "run_id": "r", "device": "cpu:0", "reading_ts": [1e6 + 0.1, 1e6 + 1.2],
           "bytes": {"process": [700 * 2**20, 710 * 2**20]}, "interval_s": 0.05})
    charts = [charts_dp.thread_states_chart(fd.thread_states_frame({label: gil, "mlp-deep · DDP": gil})),
              *charts_memory.memory_over_run_charts(fm.memory_over_run_frame(h.rows(), label, 1e6), label)]
    out = []
    for chart in charts:
        spec = chart.to_dict()
        data = {name: {k: [row.get(k) for row in rows] for k in (rows[0] if rows else {})}
                for name, rows in spec.get("datasets", {}).items()}
        out.append(("built", spec, data))
    return out


def test_no_legend_label_or_title_is_cut(specs):
    cut = _cut(specs[0] + _built())
    assert not cut, "\n".join(cut)


def test_the_walker_sees_a_cut_legend():
    spec = {"title": {"text": "short"}, "encoding": {"color": {
        "field": "run", "type": "nominal", "legend": {"title": "thread state (measured: schedstat)"}}}}
    data = {"d": {"run": ["DP ×4 · mlp-deep · cpu:0 · a config label this long"]}}
    assert len(_cut([("p", spec, data)])) == 2


MODE_OF_SERIES = {"DP": "dp", "DDP": "ddp"}  # Scale-out's series: "DP (predicted)", "DDP (measured)"


def test_every_chart_colouring_runs_or_modes_uses_the_one_mode_colour_map(specs):
    """A run is drawn in its mode's colour (a second run of a mode in a shade of it) on every
    page; a chart colouring by mode uses the same map (`app.charts.style.MODE_HUES`)."""
    from ddpviz.app.charts.style import MODE_HUES

    pages, modes = specs
    assert set(modes.values()) == {"single", "dp", "ddp", "fsdp"}
    checked, wrong, seen = 0, [], set()
    for page, spec, data in pages:
        name = str((spec.get("title") or {}).get("text"))
        for view in _walk(spec):
            colour = (view.get("encoding") or {}).get("color")
            if not isinstance(colour, dict) or colour.get("field") not in ("run", "mode", "series"):
                continue
            scale = colour.get("scale") or {}
            values = scale.get("domain") or sorted(_values(colour["field"], data))
            of = {v: modes.get(v) or (v if v in MODE_HUES else MODE_OF_SERIES.get(str(v).split(" (")[0]))
                  for v in values}
            if not any(of.values()):
                continue  # not runs or modes (the theory page's series)
            checked += 1
            seen.add((page, colour["field"]))
            if "range" not in scale or not isinstance(scale["range"], list):
                wrong.append(f"{page} '{name}': {colour['field']} coloured by a scheme, not the mode map")
                continue
            firsts: set[str] = set()
            for value, hue in zip(scale["domain"], scale["range"]):
                mode = of.get(value)
                if mode is None:
                    continue
                want = MODE_HUES[mode][0] if mode not in firsts and colour["field"] != "series" else None
                if (want and hue != want) or hue not in MODE_HUES[mode]:
                    wrong.append(f"{page} '{name}': {value} ({mode}) drawn {hue}")
                firsts.add(mode)
    assert checked >= 8, checked
    assert {("views/sweeps.py", "mode"), ("views/compare.py", "run"), ("views/live.py", "run"),
            ("views/scaleout.py", "series"), ("views/buckets.py", "run")} <= seen, seen
    assert not wrong, "\n".join(wrong)
