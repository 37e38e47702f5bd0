"""The DP timeline's GIL-wait band and caption (app/frames/dp.py, app/charts/dp.py), on hand-made
events whose figures are worked out in the comments."""

from __future__ import annotations

import json
import math

import eventgen as g
import pytest
from recorded_frames import check_chart as _check_chart

from ddpviz.app.charts import dp as charts_dp
from ddpviz.app.frames import dp as fd


def with_gil(events, waits_ms):
    """`events` with `gil_wait_s` set on dp_phase spans: waits_ms[(phase, device)] in ms."""
    out = []
    for e in events:
        if e["type"] == "dp_phase":
            w = waits_ms.get((e["phase"], e["device"]))
            e = {**e, "gil_wait_s": None if w is None else w / 1000}
        out.append(e)
    return out


def gil_event(step, device, share, wait_ms):
    return {"type": "gil", "run_id": "r", "ts": 0.0, "step": step, "device": device, "rank": 0,
            "gil_wait_s": wait_ms / 1000, "gil_wait_share": share, "source": "measured: test"}


def test_band_is_as_long_as_each_spans_wait_and_stays_inside_it():
    # eventgen's forward span is 5..11 ms (6 ms); device 1 waited 3 ms of it: a bar 5..8 ms, 50%.
    # device 0's backward (14..24 ms) reports 12 ms, more than the span: the bar stops at 24 ms.
    events = with_gil(g.dp_step("r", 0), {("forward", "cpu:1"): 3.0, ("backward", "cpu:0"): 12.0})
    band = fd.gil_band_frame(fd.dp_phase_frame(events, 0)).set_index(["device", "phase"])
    assert len(band) == 2
    fwd = band.loc[("cpu:1", "forward")]
    assert (fwd["start_ms"], fwd["end_ms"], fwd["share_pct"]) == pytest.approx((5.0, 8.0, 50.0))
    assert fwd["lane"] == "cpu:1" + fd.GIL_LANE
    assert band.loc[("cpu:0", "backward"), "end_ms"] == pytest.approx(24.0)


def test_no_measured_wait_gives_no_band():
    phases = fd.dp_phase_frame(g.dp_step("r", 0), 0)  # an older run: no gil_wait_s
    assert phases["gil_wait_ms"].isna().all()
    assert fd.gil_band_frame(phases).empty


def test_share_frame_takes_the_step_and_the_median():
    # cpu:0's shares over steps 0..2: 0.1, 0.3, 0.2 -> median 0.2; step 2's share 0.2 (4 ms)
    events = [gil_event(0, "cpu:0", 0.1, 2), gil_event(1, "cpu:0", 0.3, 6), gil_event(2, "cpu:0", 0.2, 4),
              gil_event(2, "cpu:1", 0.5, 10), {**gil_event(1, "cpu:1", None, 0), "gil_wait_share": None}]
    df = fd.gil_share_frame(events, 2).set_index("device")
    assert df.loc["cpu:0", "median_share"] == pytest.approx(0.2)
    assert df.loc["cpu:0", "step_share"] == pytest.approx(0.2) and df.loc["cpu:0", "step_gil_ms"] == pytest.approx(4)
    assert df.loc["cpu:1", "steps"] == 1  # the unmeasured step is left out
    missing = fd.gil_share_frame(events, 0).set_index("device")
    assert math.isnan(missing.loc["cpu:1", "step_share"])


def test_timeline_draws_a_gil_lane_per_device_with_its_legend_entry():
    events = with_gil(g.dp_step("r", 0), {("forward", "cpu:0"): 2.0, ("forward", "cpu:1"): 3.0})
    phases = fd.dp_phase_frame(events, 0)
    spec = _check_chart(charts_dp.dp_timeline(phases, fd.idle_frame(phases), fd.idle_summary(phases),
                                              run="DP", gil=fd.gil_band_frame(phases)))
    text = str(spec)
    assert charts_dp.GIL in text and "cpu:1 · GIL wait" in text
    plain = charts_dp.dp_timeline(phases, fd.idle_frame(phases), fd.idle_summary(phases), run="DP").to_dict()
    assert "GIL wait" not in str(plain.get("layer"))
    # the lane's span is a thin line, never a box like the idle gaps (white boxes outlined in grey read as idle)
    gil_marks = [layer["mark"] for layer in spec["layer"] if "span_start_ms" in str(layer.get("encoding"))
                 or "gil_ms" in str(layer.get("encoding"))]
    assert sorted(m["type"] for m in gil_marks) == ["bar", "rule"]
    assert not any(m.get("fill") or m["type"] == "bar" and not m.get("height") for m in gil_marks)




# ---- the shape sweep -------------------------------------------------------------------------
def shape_run(rid, mode, w, d, sps, shares):
    return {"run_id": rid, "label": f"{mode} {w}×{d}", "status": "succeeded",
            "config": {"mode": mode, "world_size": 2, "width": w, "depth": d},
            "summary": {"samples_per_s": sps, "step_time_s": 64 / sps,
                        "gil_wait_share": {f"cpu:{i}": s for i, s in enumerate(shares)}}}


def test_shape_frame_pairs_dp_and_ddp_per_shape():
    from ddpviz.app.charts import sweeps as charts_sweeps
    from ddpviz.app.frames import sweeps as fs

    runs = [shape_run("a", "dp", 16, 16, 1000.0, [0.30, 0.20]),   # DP GIL share: mean 0.25
            shape_run("b", "ddp", 16, 16, 2500.0, [0.0, 0.02]),   # DDP 0.01; DDP ÷ DP = 2.5
            shape_run("c", "dp", 1024, 2, 400.0, [0.02, None]),   # device 1 not measured: 0.02
            shape_run("d", "ddp", 1024, 2, 440.0, [0.0, 0.0]),    # 1.1
            shape_run("e", "dp", 64, 8, 900.0, [0.1, 0.1])]       # no DDP run yet: left out
    shapes = fs.shape_frame(fs.sweep_frame(runs))
    assert shapes["shape"].tolist() == ["1024×2", "16×16"]  # ordered by DP's GIL share
    row = shapes.set_index("shape").loc["16×16"]
    assert row["dp_gil_share"] == pytest.approx(0.25) and row["ddp_gil_share"] == pytest.approx(0.01)
    assert row["ddp_over_dp"] == pytest.approx(2.5)
    assert shapes.set_index("shape").loc["1024×2", "dp_gil_share"] == pytest.approx(0.02)
    _check_chart(charts_sweeps.shape_gil_chart(shapes))
    _check_chart(charts_sweeps.shape_share_chart(shapes))


def test_shape_values_parse_and_sweep_submits_a_dp_and_a_ddp_run_per_shape():
    from ddpviz.app.frames import sweeps as fs
    from ddpviz.workers.sweeps import sweep_configs

    assert fs.parse_values("16x16, 1024×2", "shape") == [(16, 16), (1024, 2)]
    for bad in ("16", "16x", "0x4", "axb"):
        with pytest.raises(ValueError):
            fs.parse_values(bad, "shape")
    items = sweep_configs({"steps": 30}, "shape", [(16, 16), (1024, 2)])
    assert [(c["mode"], c["width"], c["depth"], label) for c, label in items] == [
        ("dp", 16, 16, "DP 16×16"), ("ddp", 16, 16, "DDP 16×16"),
        ("dp", 1024, 2, "DP 1024×2"), ("ddp", 1024, 2, "DDP 1024×2")]


def test_sweeps_page_launches_a_shape_sweep_and_draws_it(real_client, app_test):
    from ddpviz.engine.result import RunStatus

    at = app_test("views/sweeps.py")
    at.radio(key="sweep_kind").set_value("shape").run()
    at.text_input(key="sweep_values_shape").input("16x16, 1024x2")
    at.button(key="sweep_launch").click().run()
    assert not at.exception and not at.error
    runs = real_client.list_runs()
    assert sorted((r["config"]["mode"], r["config"]["width"], r["config"]["depth"]) for r in runs) == [
        ("ddp", 16, 16), ("ddp", 1024, 2), ("dp", 16, 16), ("dp", 1024, 2)]
    for r in runs:  # finished by hand: samples/s and GIL shares as a worker's summary carries them
        dp, deep = r["config"]["mode"] == "dp", r["config"]["depth"] == 16
        real_client.store.mark_started(r["run_id"], "w")
        real_client.store.finish(r["run_id"], RunStatus.SUCCEEDED, summary={
            "samples_per_s": 1000.0 if dp else (2000.0 if deep else 1100.0), "step_time_s": 0.05,
            "gil_wait_share": {"cpu:0": (0.3 if deep else 0.02) if dp else 0.0, "cpu:1": 0.0}})
    at = app_test("views/sweeps.py")
    assert not at.exception
    titles = [json.loads(c.proto.spec)["title"]["text"] for c in at.get("vega_lite_chart")]
    assert titles == ["GIL wait and DDP ÷ DP, per model shape", "GIL wait per model shape"]
    assert "gil_wait_share" in at.dataframe[0].value.columns


def test_thread_states_are_each_devices_medians_by_hand():
    from ddpviz.app.charts.dp import thread_states_chart
    from ddpviz.app.frames.dp import thread_states_frame

    def gil(step, dev, on, wait, runq, idle):
        return {"type": "gil", "step": step, "device": dev, "on_cpu_s": on, "gil_wait_s": wait,
                "runnable_s": runq, "thread_wait_s": idle, "other_wait_s": 0.0}
    # cpu:1's GIL wait over three steps: 1, 3, 2 ms -> median 2 ms; on CPU 4, 4, 6 -> 4 ms
    dp = [gil(0, "cpu:1", 0.004, 0.001, 0.0, 0.001), gil(1, "cpu:1", 0.004, 0.003, 0.0, 0.001),
          gil(2, "cpu:1", 0.006, 0.002, 0.0, 0.001)]
    ddp = [gil(0, "cpu:0", 0.005, 0.0, 0.001, 0.0), {"type": "gil", "step": 1, "device": "cpu:0",
                                                     "gil_wait_s": None}]
    df = thread_states_frame({"DP": dp, "DDP": ddp}).set_index(["device", "state"])
    assert df.loc[("DP · cpu:1", "waiting for the GIL"), "ms"] == pytest.approx(2.0)
    assert df.loc[("DP · cpu:1", "running (on a CPU)"), "ms"] == pytest.approx(4.0)
    assert df.loc[("DP · cpu:1", "waiting for the GIL"), "share"] == pytest.approx(2.0 / 7.0)
    assert df.loc[("DDP · cpu:0", "waiting for the GIL"), "ms"] == 0.0  # the unread step left out
    assert df.loc[("DDP · cpu:0", "waiting for a CPU (all cores busy)"), "ms"] == pytest.approx(1.0)
    spec = thread_states_chart(thread_states_frame({"DP": dp})).to_dict()
    assert spec["title"]["text"].startswith("The lock") and "schedstat" in str(spec["encoding"]["color"])


def test_the_lock_chart_leaves_its_bands_room_beside_the_wrapped_subtitle_and_the_legend_below():
    """Streamlit fits the whole chart in its height. A DDP-only run (2 ranks, 5 thread states) drew its
    bands a pixel tall in Chromium: the 160 px box held the title and its wrapped subtitle, the axis and
    the legend below. Hand-worked room: the title's box (CHROME_PX, 120) + 2 rows of ROW_PX (42) + the
    subtitle's lines past the first (16 px each) + the legend (its title and 3 rows of 2 entries, 22 px each)."""
    from ddpviz.app.charts.dp import thread_states_chart
    from ddpviz.app.frames.dp import thread_states_frame

    def gil(dev):
        return {"type": "gil", "step": 0, "device": dev, "on_cpu_s": 0.004, "gil_wait_s": 0.001,
                "runnable_s": 0.001, "thread_wait_s": 0.001, "other_wait_s": 0.001}

    spec = thread_states_chart(thread_states_frame({"DDP": [gil("cpu:0"), gil("cpu:1")]})).to_dict()
    subtitle_lines = len(spec["title"]["subtitle"]) if isinstance(spec["title"]["subtitle"], list) else 1
    assert spec["height"] >= 120 + 2 * 42 + 16 * (subtitle_lines + 1 - 2) + 4 * 22


def test_the_lock_chart_lists_in_its_legend_only_the_states_it_draws():
    """A legend lists only what its chart draws (issue 33): a fresh user's Learn page listed
    "waiting for the all-reduce" under a chart with none of it. DP's threads never wait for an
    all-reduce (their `gil` events carry no other_wait_s) and a DDP rank waits measurably only where
    its wait was measured apart (0 otherwise): no bar, no entry. Where a rank has some, the entry
    is back, in the colour `app.charts.style` gives it."""
    from ddpviz.app.charts import style
    from ddpviz.app.charts.dp import thread_states_chart
    from ddpviz.app.frames.dp import thread_states_frame

    def gil(dev, **other):
        return {"type": "gil", "step": 0, "device": dev, "on_cpu_s": 0.004, "gil_wait_s": 0.002,
                "runnable_s": 0.001, "thread_wait_s": 0.001, **other}

    def drawn(spec):
        scale = spec["encoding"]["color"]["scale"]
        rows = [r for rows in spec["datasets"].values() for r in rows]
        assert scale["range"] == [style.THREAD_STATE_HUES[s] for s in scale["domain"]]
        assert {r["state"] for r in rows if r["ms"] > 0} == set(scale["domain"])  # every entry has a bar
        return scale["domain"]

    dp, ddp = [gil("cpu:0"), gil("cpu:1")], [gil("cpu:0", other_wait_s=0.0), gil("cpu:1", other_wait_s=0.0)]
    four = ["running (on a CPU)", "waiting for the GIL", "waiting for a CPU (all cores busy)", "outside its timed work"]
    assert drawn(thread_states_chart(thread_states_frame({"DP": dp, "DDP": ddp})).to_dict()) == four
    ddp[1]["other_wait_s"] = 0.0005  # rank 1 waited 0.5 ms for the all-reduce
    assert drawn(thread_states_chart(thread_states_frame({"DP": dp, "DDP": ddp})).to_dict()) == [
        *four, "waiting for the all-reduce"]


def test_twelve_devices_are_drawn_in_numeric_order_not_as_text():
    """A 64-device DP run's lanes read cpu:0, cpu:1, cpu:10, cpu:11, ... cpu:19, cpu:2 (a new user, 2026-12-06)."""
    from ddpviz.app.frames.base import device_order

    by_hand = [f"cpu:{i}" for i in range(12)]
    assert device_order(reversed(by_hand)) == by_hand and sorted(by_hand) != by_hand  # text order differs
    phases = fd.dp_phase_frame(g.dp_step("r", 0, world_size=12), 0)
    timeline = charts_dp.dp_timeline(phases, fd.idle_frame(phases), fd.idle_summary(phases), run="DP").to_dict()
    lanes = next(layer["encoding"]["y"]["sort"] for layer in timeline["layer"] if "sort" in layer["encoding"]["y"])
    assert lanes == by_hand
    assert charts_dp.dp_phase_chart(phases).to_dict()["encoding"]["y"]["sort"] == by_hand
    assert list(fd.idle_summary(phases)["device"]) == by_hand
