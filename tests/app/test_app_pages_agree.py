"""Pages that agree (issue 21): DP's copies are never called exposed comm, one colour per mode,
a DP timeline that opens on a typical step, memory axes that end at the data. On the recorded real
runs of tests/app/data, read back against their own events."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest
from recorded import DATA, FILES

from ddpviz.app.frames import compare as fc
from ddpviz.app.frames import steps as fsteps


def _view(mode: str) -> fc.RunView:
    events = [json.loads(line) for line in (DATA / FILES[mode]).read_text().splitlines() if line.strip()]
    by_type = defaultdict(list)
    for e in events:
        by_type[e["type"]].append(e)
    started, finished = by_type["run_started"][0], by_type["run_finished"][-1]
    record = {"config": started["config"], "summary": finished["summary"], "status": "succeeded"}
    return fc.RunView(label=mode.upper(), record=record, events=dict(by_type), started=started,
                      finished=finished)


@pytest.fixture(scope="module")
def views():
    return {m: _view(m) for m in ("dp", "ddp", "single")}


def test_dp_copies_are_never_called_exposed_comm(views):
    dp, ddp = views["dp"], views["ddp"]
    table = fc.side_by_side(fc.compare_frame([dp, ddp])).set_index("measure")
    copies = f"  {fsteps.DP_COPIES} (ms)"
    assert table.loc["  exposed comm (ms)", "DP"] == "—"
    assert table.loc[copies, "DP"] == f"{dp.summary['comm_exposed_s'] * 1e3:.2f}"  # its copies' time
    assert table.loc["  exposed comm (ms)", "DDP"] == f"{ddp.summary['comm_exposed_s'] * 1e3:.2f}"
    assert table.loc[copies, "DDP"] == "—"
    steps = fsteps.steps_frame(dp.of_type("step"), "DP")
    split = fsteps.split_frame(steps, {"DP": "dp"})
    assert fsteps.DP_COPIES_PART in set(split["part"]) and "exposed comm" not in set(split["part"])
    ddp_split = fsteps.split_frame(fsteps.steps_frame(ddp.of_type("step"), "DDP"), {"DDP": "ddp"})
    assert "exposed comm" in set(ddp_split["part"]) and fsteps.DP_COPIES_PART not in set(ddp_split["part"])
    # the chart's legend names only the parts present
    from ddpviz.app.charts.steps import split_chart

    legend = split_chart(split).to_dict()["layer"][0]["encoding"]["color"]["scale"]["domain"]
    assert fsteps.DP_COPIES_PART in legend and "exposed comm" not in legend


def _step_times(mode: str) -> dict[int, tuple[float, bool]]:
    """step -> (ms, instrumented) straight from the recording's step events (one rank: DP)."""
    out = {}
    for line in (DATA / FILES[mode]).read_text().splitlines():
        e = json.loads(line)
        if e["type"] == "step":
            out[e["step"]] = (e["step_time_s"] * 1e3, bool(e.get("memory_traced") or e.get("replica_check")))
    return out


def test_dp_timeline_opens_on_a_typical_step(views):
    from ddpviz.app.frames import dp as fd

    dp = views["dp"]
    phase_steps = fd.dp_steps(dp.of_type("dp_phase"))
    times = _step_times("dp")  # every step of this recording was memory-traced; 11 also checked replicas
    steady = sorted(times)[3:]  # 12 steps: a quarter are warm-up
    median = sorted(times[s][0] for s in steady)[len(steady) // 2]
    want = min(steady, key=lambda s: abs(times[s][0] - median))
    assert fd.typical_step(phase_steps, dp.of_type("step")) == want
    assert want != phase_steps[-1] and times[phase_steps[-1]][0] > 1.4 * times[want][0]  # the latest is slow
    # with the later steps plain (not instrumented), a plain one is chosen, never a traced one
    plain = [{**e, "memory_traced": False, "replica_check": None} if e["step"] in (8, 9, 10) else e
             for e in dp.of_type("step")]
    assert fd.typical_step(phase_steps, plain) in (8, 9, 10)
    assert fd.instrumented_steps(plain) == set(times) - {8, 9, 10}


def test_the_time_every_device_waits():
    import pandas as pd

    from ddpviz.app.frames import dp as fd

    # device 0 busy 0-4 and 6-9, device 1 busy 3-5: both wait 5-6 only (and nothing after 9)
    phases = pd.DataFrame({"step": 1, "device": ["cpu:0", "cpu:0", "cpu:1"], "start_ms": [0.0, 6.0, 3.0],
                           "end_ms": [4.0, 9.0, 5.0]})
    assert fd.all_idle_ms(phases) == pytest.approx(1.0)
    assert fd.all_idle_ms(phases.iloc[[0, 1]]) == pytest.approx(2.0)


def _hue_word(hex_colour: str) -> str:
    """A colour's common name from its hue, lightness and saturation (colorsys): the reference
    the bucket chart's words are checked against."""
    import colorsys

    r, g, b = (int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5))
    h, light, s = colorsys.rgb_to_hls(r, g, b)
    if light < 0.15:
        return "black"
    if s < 0.15:
        return "grey"
    deg = h * 360
    return ("red" if deg < 15 or deg >= 345 else "orange" if deg < 45 else "yellow" if deg < 70
            else "green" if deg < 170 else "blue" if deg < 260 else "purple")


def test_bucket_chart_colour_note_matches_the_colours_drawn(views):
    from ddpviz.app.charts import buckets as cb
    from ddpviz.app.frames import buckets as fb

    ddp = views["ddp"]
    events = ddp.of_type("bucket") + ddp.of_type("step")
    step = fb.bucket_steps(events)[-1]
    b = fb.with_rank_names(fb.bucket_frame(events, step), {})
    bw = fb.with_rank_names(fb.backward_frame(events, step), {})
    ex = fb.with_rank_names(fb.exposed_frame(b, ddp.of_type("step")), {})
    spec = cb.bucket_timeline(b, bw, ex, run="DDP").to_dict()
    subtitle = " ".join(spec["title"]["subtitle"])
    scale = next(layer["encoding"]["color"]["scale"] for layer in spec["layer"])
    colour = dict(zip(scale["domain"], scale["range"]))
    for kind, name in cb.COLOUR_NAMES.items():
        if kind in colour:  # the starts-only mark is drawn (and in the legend) only where a step needs it
            assert _hue_word(colour[kind]) in name, (kind, colour[kind], name)
    assert f"{cb.COLOUR_NAMES['exposed comm']} under a lane: exposed comm" in subtitle
    # every mark is drawn in its legend swatch's colour: none faded by an opacity below 1
    for layer in spec["layer"]:
        mark = layer["mark"] if isinstance(layer["mark"], dict) else {"type": layer["mark"]}
        assert mark.get("opacity", 1) == 1, layer["mark"]


def test_memory_axes_end_near_the_data_and_read_in_whole_mib():
    from ddpviz.app.charts import memory as cm
    from ddpviz.app.frames import memory as fm
    from ddpviz.app.step_history import ReadingHistory

    mib = 2**20
    h = ReadingHistory(bin_s=1.0)  # a nearly flat process, 662.1-662.4 MiB, readings up to 23.4 s
    ts = [1e6 + 0.2 + 0.8 * i for i in range(30)]
    h.add({"type": "memory_readings", "run_id": "r", "device": "cpu:0", "reading_ts": ts,
           "bytes": {"process": [int((662.1 + 0.01 * i) * mib) for i in range(30)]}, "interval_s": 0.05})
    spec = cm.memory_over_run_charts(fm.memory_over_run_frame(h.rows(), "DP", 1e6), "DP")[0].to_dict()
    band, line, extent = spec["layer"]
    # the x axis ends at the data: no padded domain in the spec (a live refresh keeps the view), nice off
    x = band["encoding"]["x"]["scale"]
    assert "domain" not in x and x["nice"] is False
    last = max(r["t_s"] for rows in spec["datasets"].values() for r in rows if "readings" in r)
    assert 23.0 <= last <= 23.5  # the last bin's readings: the axis ends there, not at 25
    # y: whole MiB, a few ticks: the invisible extent layer's rows hold the range, as data
    y = band["encoding"]["y"]
    assert y["axis"]["format"] == ",.0f" and extent["encoding"]["y"] == y and extent["mark"]["opacity"] == 0
    lo, hi = (r["lo_mib"] for r in spec["datasets"][extent["data"]["name"]])
    assert lo <= 662.1 and hi >= 662.4 and hi - lo >= cm.MIN_SPAN_MIB and lo == int(lo) and hi == int(hi)


def test_theory_probe_note_names_the_runs_own_sizes():
    from ddpviz.app.frames.theory import probe_note

    pts = [{"nbytes": n, "time_s": 1e-4 * (1 + n / 4096), "busbw_bytes_per_s": 1e9} for n in (4096, 8192, 170_000)]
    text = probe_note({"points": pts, "run_nbytes": [170_000], "backend": "gloo", "iters": 10,
                       "warmup_iters": 3, "fit": None}, 2)
    assert "First the run's own bucket sizes (166 KiB)" in text  # 170,000 B / 1024 = 166.02: three figures


def test_a_launched_pair_becomes_every_pages_run_set(real_client, app_test):
    """Compare, DP timeline, Theory and Learn visited on an older set, then a pair launched: each
    page shows the pair's group (the trio button did this already; the pair button now too)."""
    from recorded import trio

    old, _ = trio(real_client)
    at = app_test("views/compare.py")
    assert at.session_state["compare_set"] == old
    for page in ("views/dp_timeline.py", "views/theory.py"):
        at.switch_page(page).run()
    at.switch_page("views/launch.py").run()
    at.segmented_control(key="launch_what").set_value("pair").run()
    at.number_input(key="cfg_steps").set_value(2).run()
    at.button(key="launch_pair").click().run()
    assert not at.exception
    pair = {r["group"] for r in real_client.list_runs() if r["group"] != old}
    assert len(pair) == 1
    (new,) = pair
    for page, key in (("views/compare.py", "compare_set"), ("views/dp_timeline.py", "dp_set"),
                      ("views/theory.py", "theory_set"), ("views/learn.py", "learn_set")):
        at.switch_page(page).run()
        assert not at.exception, page
        assert at.session_state[key] == new, page
    # a set picked on a page is then kept there, and followed by the others
    at.selectbox(key="learn_set").set_value(old).run()
    assert at.session_state["learn_set"] == old
    at.switch_page("views/compare.py").run()
    assert at.session_state["compare_set"] == old


def test_an_unmeasured_overlap_says_so_and_a_measured_one_is_a_percent(views):
    """bucket_timing=recorder (the default): the summary's overlap is null with `overlap_note`; Compare
    says "not measured", never a dash or 0%. The recorded DDP run (hook) keeps its percent."""
    from dataclasses import replace

    from ddpviz.engine.summary import OVERLAP_NOT_MEASURED

    ddp = views["ddp"]
    unmeasured = replace(ddp, label="DDP rec", record={**ddp.record, "summary": {
        **ddp.summary, "overlap": None, "overlap_note": OVERLAP_NOT_MEASURED}})
    table = fc.side_by_side(fc.compare_frame([ddp, unmeasured])).set_index("measure")
    row = "overlap (1 − exposed / total comm)"
    assert table.loc[row, "DDP"] == f"{ddp.summary['overlap']:.0%}"
    assert table.loc[row, "DDP rec"] == ("not measured (all-reduce spans on profiled steps only: "
                                         "bucket_timing=recorder)")
    assert table.loc["  exposed comm (ms)", "DDP rec"] == f"{ddp.summary['comm_exposed_s'] * 1e3:.2f}"
