"""Every chart the pages draw, walked through its Vega-Lite spec, on recorded real runs: no legend
label, legend title, axis label or title line is longer than the room Vega gives it (Vega cuts
it with "…" there), and every chart coloured by mode uses the app's one mode colour map.

Text widths are estimates (generous ones for labels and titles: 6.5 px a character at 11 px, 7.7
at 13 px bold; a subtitle's 5.3 px as measured), so a failure is a line that would be cut, or close.
The room: a legend's or axis's `labelLimit` (Vega's defaults 160 and 180 px where unset), a
legend's `titleLimit` (180 px), and a chart title's plot width, which Vega uses as its limit: the
narrowest chart the pages draw is half of a page column at 1024 px, so `TITLE_ROOM_PX`; Learn's
theory drawings, three to a row, a third of one (`THIRD_ROOM_PX`). A legend above or below the
plot lays its entries side by side (`columns` of them a row), and Vega lays the legends sharing
that side in one row too (unless the chart stacks them: `app.charts.style.stacked_legends`),
starting at the plot's left edge, right of the y axis: the row must fit the chart's width
(`ROW_ROOM_PX`, at 1280 px) less the y axis (`Y_AXIS_PX`), or its last entries fall off the
chart's edge ("hub (dev", "optimi" in a fresh user's tour).
"""

from __future__ import annotations

import io
import json

import pandas as pd
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
THIRD_ROOM_PX = 220  # Learn's star, ring and tree at a chosen n: a third of a page column at 1280 px
THIRD = ("star (DP),", "ring (DDP),", "tree (one of")
Y_AXIS_PX = 60  # a y axis's labels and title, left of the plot where a legend above or below starts
LEGEND_GAP_PX = 16  # between two legends on one side
LEGEND_CHANNELS = ("color", "shape", "strokeDash", "size", "strokeWidth", "opacity")  # those with a legend
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


def _empty_views(spec: dict, data: dict, name: str = "") -> list[str]:
    """The marks of `spec` (layers and concatenations too) drawn from a dataset without a row:
    Vega warns "Infinite extent for field ..." for each field a scale takes from one."""
    name = (spec.get("data") or {}).get("name", name)
    mark = spec.get("mark")
    out = []
    if mark and name in data and not any(len(column) for column in data[name].values()):
        fields = sorted(k for k, e in (spec.get("encoding") or {}).items() if isinstance(e, dict) and "field" in e)
        out.append(f"a {mark if isinstance(mark, str) else mark.get('type')} of {fields}")
    for key in ("layer", "hconcat", "vconcat", "concat"):
        for sub in spec.get(key, []):
            out += _empty_views(sub, data, name)
    return out


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
        limit = title.get("limit") or (THIRD_ROOM_PX if name.startswith(THIRD) else TITLE_ROOM_PX)
        sides: dict[str, dict[tuple, float]] = {"top": {}, "bottom": {}}  # legend -> its width (px)
        y_axis = False
        cut += [f"{page} '{name}': title line '{t}'" for t in _lines(title.get("text")) if _px(t, 13) > limit]
        cut += [f"{page} '{name}': subtitle line '{t}'" for t in _lines(title.get("subtitle"))
                if len(t) * SUBTITLE_PX_PER_CHAR > limit]
        for view in _walk(spec):
            for channel, enc in (view.get("encoding") or {}).items():
                if not isinstance(enc, dict):
                    continue
                domain = (enc.get("scale") or {}).get("domain")
                shown = list(domain) if isinstance(domain, list) else []  # in the legend's order
                if enc.get("type") == "nominal" and "field" in enc:
                    shown += sorted(_values(enc["field"], data) - set(shown), key=str)
                leg = enc.get("legend", {}) if channel in LEGEND_CHANNELS else None
                if isinstance(leg, dict):
                    label_limit = leg.get("labelLimit", LEGEND_LABEL_LIMIT) or 1e9
                    cut += [f"{page} '{name}': {channel} legend label '{v}'" for v in shown
                            if _px(v) > label_limit]
                    if leg.get("title") and _px(leg["title"]) > (leg.get("titleLimit", LEGEND_TITLE_LIMIT) or 1e9):
                        cut += [f"{page} '{name}': legend title '{leg['title']}'"]
                    if leg.get("orient") in ("top", "bottom"):
                        # keyed by field and title: Vega-Lite merges one field's colour and shape legends
                        sides[leg["orient"]][(enc.get("field"), leg.get("title"))] = _legend_px(
                            {"title": enc.get("title"), **leg}, shown)
                y_axis |= channel == "y" and enc.get("axis", {}) is not None
                axis = enc.get("axis", {}) if channel in ("x", "y") else None
                if axis is not None and enc.get("type") == "nominal":
                    axis_limit = axis.get("labelLimit", AXIS_LABEL_LIMIT) or 1e9
                    cut += [f"{page} '{name}': {channel} axis label '{v}'" for v in shown if _px(v) > axis_limit]
        cut += [f"{page} '{name}': {row}" for row in _legend_rows(spec, name, sides, y_axis)]
    return sorted(set(cut))


def _legend_rows(spec: dict, name: str, sides: dict[str, dict[tuple, float]], y_axis: bool) -> list[str]:
    """The sides (top, bottom) of the chart titled `name` whose legends, side by side unless the
    chart stacks them, run past its width less its y axis."""
    room = (FULL_WIDTH_PX if name.startswith(FULL_WIDTH) else THIRD_ROOM_PX if name.startswith(THIRD)
            else ROW_ROOM_PX) - (Y_AXIS_PX if y_axis else 0)
    layout = str(((spec.get("config") or {}).get("legend") or {}).get("layout"))
    out = []
    for side, widths in sides.items():
        stacked = f"{side}: {{direction: 'vertical'" in layout  # one under the other
        row = (max(widths.values(), default=0) if stacked
               else sum(widths.values()) + LEGEND_GAP_PX * max(0, len(widths) - 1))
        if row > room:
            out.append(f"{len(widths)} legend(s) {side}, a row of ~{row:.0f} px in {room} px")
    return out


def _legend_px(leg: dict, shown: list) -> float:
    """A legend's width: its title's, or its widest row of entries (`columns` a row, Vega sizing
    each column to its widest entry; one column where it is vertical)."""
    entry = [len(str(v)) * ROW_PX_PER_CHAR + LEGEND_SYMBOL_PX for v in shown] or [0.0]
    cols = 1 if leg.get("direction") == "vertical" else (leg.get("columns") or len(entry))
    return max(sum(max(entry[j::cols]) for j in range(min(cols, len(entry)))), _px(leg.get("title") or ""))


def _built() -> list[tuple[str, dict, dict]]:
    """Charts the recordings do not reach (no thread states, no memory timer, no traced step of
    today's engine on GPUs in them), built from their frames with run labels as long as a labelled
    run's (`mlp-deep · DP · c…`)."""
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
              *charts_memory.memory_over_run_charts(fm.memory_over_run_frame(h.rows(), label, 1e6), label),
              *charts_memory.memory_curve_charts(*_traced_dp_step(), label)]
    return [_spec("built", chart) for chart in charts]


def _spec(page: str, chart) -> tuple[str, dict, dict]:
    """(page, spec, {dataset name: columns}) of a chart built here."""
    spec = chart.to_dict()
    data = {name: {k: [row.get(k) for row in rows] for k in (rows[0] if rows else {})}
            for name, rows in spec.get("datasets", {}).items()}
    return page, spec, data


def _traced_dp_step(devices: int = 8):
    """A traced step of DP on `devices` GPUs as today's engine reports it (the recordings predate
    it): every DP phase and the instrument's two (the replica check, the window after the step),
    a CUDA allocator line per device and the GPU's NVML line. Returns (curve, phases) frames."""
    from ddpviz.app.frames import memory as fm
    from ddpviz.app.frames.dp import DP_PHASES
    from ddpviz.engine.events import AFTER_STEP_PHASE, REPLICA_CHECK_PHASE

    names = DP_PHASES + [REPLICA_CHECK_PHASE, AFTER_STEP_PHASE]
    phases = pd.DataFrame({"phase": names, "start_ms": range(len(names)), "end_ms": range(1, len(names) + 1)})
    curve = pd.DataFrame([{"run": "r", "step": 3, "device": f"cuda:{d}", "source": src,
                           "source_label": fm.SOURCE_LABELS[src], "t_ms": t, "mib": 100.0 + t + d}
                          for d in range(devices) for src in ("cuda", "nvml") for t in (0.0, 5.0)],
                         columns=fm.CURVE_COLUMNS)
    return curve, phases


def test_no_legend_label_or_title_is_cut(specs):
    cut = _cut(specs[0] + _built())
    assert not cut, "\n".join(cut)


def test_narrow_charts_keep_their_legends_and_titles_inside_their_column():
    """Without pages, fast: Learn's star, ring and tree at n = 8 (a third of a column each; their
    link-width and node legends side by side were cut, "hub (dev") and Live's memory charts of a
    DP step on 8 GPUs (the phase legend four to a row was cut, "optimi"; eight devices in a row)."""
    from ddpviz.app.charts import memory as charts_memory
    from ddpviz.app.charts.topology import topology_chart
    from ddpviz.app.frames import topology as ftop

    n, p_bytes = 8, 0.575 * 2**20  # the recorded runs' gradient bytes
    drawn = {"star (DP)": (ftop.theory_star(n, p_bytes), "2·P per link per step; device 0 makes 14 copies in turn"),
             "ring (DDP)": (ftop.theory_ring(n, p_bytes), "2(n−1)/n·P per link; 14 steps in sequence (latency ∝ n−1)"),
             "tree (one of NCCL's two)": (ftop.theory_tree(n, p_bytes),
                                          "P per link (half up, half down); 6 steps (∝ log2 n)")}
    charts = [topology_chart(*frames, heading=f"{kind}, n\u00a0=\u00a0{n} (theory)", subtitle=sub, max_mib=1.2,
                             arrows=kind.startswith("ring")) for kind, (frames, sub) in drawn.items()]
    charts += charts_memory.memory_curve_charts(*_traced_dp_step(), "mlp-deep · DP · config 3")
    cut = _cut([_spec("narrow", c) for c in charts])
    assert not cut, "\n".join(cut)


def test_no_chart_on_a_page_draws_a_layer_without_data(specs):
    """Every page on the recorded runs: no layer with no rows (an older run's memory step with no
    curve, the time chart's algbw), each one a console warning "Infinite extent" in the browser
    (issue 33's tour); Live's bins before step 500 excepted, on purpose."""
    empty = [f"{page} '{(spec.get('title') or {}).get('text')}': {view}"
             for page, spec, data in specs[0] + _built() for view in _empty_views(spec, data)]
    # but Live's bins before step 500, on purpose (`app.charts.live.live_throughput_chart`)
    bins = {"views/live.py 'Throughput per step': a rect of ['color', 'x', 'x2', 'y', 'y2']",
            "views/live.py 'Throughput per step': a line of ['color', 'detail', 'x', 'y']"}
    assert not [e for e in empty if e not in bins], "\n".join(empty)


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
