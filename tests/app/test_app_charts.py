"""Chart specs: every chart has a title, axis titles with units, a legend, and the right data."""

import eventgen as g
import pandas as pd
import pytest

from ddpviz.app.charts import dp as charts_dp
from ddpviz.app.charts import memory as charts_memory
from ddpviz.app.charts import steps as charts
from ddpviz.app.frames import buckets as fb
from ddpviz.app.frames import dp as fd
from ddpviz.app.frames import memory as fm
from ddpviz.app.frames import steps as fsteps


def _encodings(spec: dict) -> list[dict]:
    """Every `encoding` block of a (possibly layered or faceted) Vega-Lite spec."""
    out = [spec["encoding"]] if "encoding" in spec else []
    for layer in spec.get("layer", []):
        out += _encodings(layer)
    if "spec" in spec:
        out += _encodings(spec["spec"])
    return out


def _check(chart, x_title: str, y_title: str, legend_title: str) -> dict:
    spec = chart.to_dict()
    title = spec["title"]
    assert title["text"], "chart needs a title"
    encs = _encodings(spec)
    assert any(e.get("x", {}).get("title") == x_title for e in encs)
    assert any(e.get("y", {}).get("title") == y_title for e in encs)
    colours = [e["color"] for e in encs if "color" in e]
    assert colours and all(c["legend"]["title"] == legend_title for c in colours)
    return spec


def _data(spec: dict) -> list[list[dict]]:
    return list(spec.get("datasets", {}).values())


@pytest.fixture
def two_runs():
    dp = [e for s in range(4) for e in g.dp_step("a", s)]
    ddp = [e for s in range(4) for e in g.ddp_step("b", s)]
    return dp, ddp


def test_throughput_chart(two_runs):
    dp, ddp = two_runs
    steps = pd.concat([fsteps.steps_frame(dp, "dp"), fsteps.steps_frame(ddp, "ddp")])
    spec = _check(charts.throughput_curves_chart(steps), "optimizer step", "throughput (samples/s)", "run")
    assert [layer["mark"]["type"] for layer in spec["layer"]] == ["circle", "line"]
    assert spec["layer"][1]["encoding"]["y"]["field"] == "samples_per_s_smooth"
    rows = _data(spec)[0]
    assert {r["run"] for r in rows} == {"dp", "ddp"} and len(rows) == 8


def test_split_chart_stacks_parts_in_order(two_runs):
    dp, ddp = two_runs
    split = fsteps.split_frame(pd.concat([fsteps.steps_frame(dp, "dp"),
                                          fsteps.steps_frame(ddp, "ddp")]))
    spec = _check(charts.split_chart(split), "median time per step (ms)", "run",
                  "part of the step")
    # the parts present, in SPLIT_PARTS order (no DP copies: no run's mode says DP)
    bars = spec["layer"][0]  # then the run names, written over the bars
    assert bars["encoding"]["color"]["scale"]["domain"] == ["forward", "backward", "exposed comm", "optimizer", "other"]
    assert bars["encoding"]["x"]["stack"] == "zero"


def test_memory_curve_charts_name_every_source_and_share_the_axes(two_runs):
    dp, _ = two_runs
    curve = fm.memory_curve_frame(dp, "dp")
    held, host = (c.to_dict() for c in charts_memory.memory_curve_charts(
        curve, fm.memory_phase_frame(dp, 3), "dp", y_max_mib=10.0))
    assert held["title"]["text"] == "Memory within a step: dp"  # the step is in the caption
    bands, lines = held["layer"]
    assert bands["encoding"]["color"]["legend"]["title"] == "phase (background)"
    assert lines["encoding"]["x"]["title"] == "ms from the step's start"
    assert lines["encoding"]["y"]["title"] == "bytes held (MiB)"
    assert lines["encoding"]["y"]["scale"]["domain"] == [0, 10.0]
    assert lines["encoding"]["strokeDash"]["legend"]["title"] == "source"
    # over a line with points Vega draws a stroke symbol with no swatch unless it has a fill colour
    # (seen in Chromium: "tensors (live-tensor ledger)" with nothing beside it)
    assert lines["encoding"]["strokeDash"]["legend"]["symbolFillColor"]
    assert lines["encoding"]["color"]["legend"]["title"] == "device"
    # one time axis ending at the data (the step's 32 ms of phases): set by the data, nice off, so
    # the spec stays the same while a run trains; the process chart stretched to the same 32 ms
    host_lines, extent = host["layer"]
    for c in (bands, lines, host_lines, extent):
        assert "domain" not in c["encoding"]["x"]["scale"] and c["encoding"]["x"]["scale"]["nice"] is False
    assert [r["t_ms"] for r in host["datasets"][extent["data"]["name"]]] == [0.0, 32.0]
    labels = {r["source_label"] for c in (held, host) for rows in _data(c) for r in rows
              if "source_label" in r}
    assert labels == {"tensors (live-tensor ledger)", "process RSS (psutil)"}
    assert lines["encoding"]["strokeDash"]["scale"]["domain"] == ["tensors (live-tensor ledger)"]


def test_live_bucket_timeline_is_the_bucket_pages_design_with_a_stable_title(two_runs):
    from ddpviz.app.charts.buckets import bucket_timeline
    from ddpviz.app.frames.buckets import exposed_frame, with_rank_names

    _, ddp = two_runs
    buckets = fb.bucket_frame(ddp)
    names = {0: "rank 0", 1: "rank 1"}
    chart = bucket_timeline(with_rank_names(buckets, names),
                            with_rank_names(fb.backward_frame(ddp, 3), names),
                            with_rank_names(exposed_frame(buckets, ddp), names), run="Gradient buckets",
                            latest=True)
    spec = chart.to_dict()
    assert spec["title"]["text"] == "Gradient buckets" and "step" not in spec["title"]["text"]
    comm = spec["layer"][2]["encoding"]
    assert (comm["x"]["field"], comm["x2"]["field"]) == ("comm_start_ms", "comm_end_ms")
    assert any(t["field"] == "nbytes" for t in comm["tooltip"])  # bytes on hover


def test_each_ranks_lane_starts_at_its_own_backward_and_the_axis_says_so():
    """Rank 1's backward began 4.4 ms after rank 0's (a new user's default run, 2026-12-06): on an axis titled
    "ms from backward start" rank 1 seemed to finish an all-reduce rank 0 had not joined. The bucket times are
    seconds from each rank's own backward start (docs/events.md), so both lanes begin at 0 and the axis says so."""
    from ddpviz.app.charts.buckets import bucket_timeline
    from ddpviz.app.frames.buckets import exposed_frame, with_rank_names

    def b(rank, ready):
        return dict(type="bucket", step=5, rank=rank, bucket_index=0, nbytes=1000, num_params=1, ready_s=ready,
                    comm_start_s=ready, comm_end_s=ready + 0.0006, is_last=True)
    events = [b(0, 0.0036), b(1, 0.0015),
              dict(type="step", step=5, rank=0, backward_s=0.0036, comm_exposed_s=0.0006, backward_start_ts=100.0),
              dict(type="step", step=5, rank=1, backward_s=0.0015, comm_exposed_s=0.0006, backward_start_ts=100.0044)]
    buckets, names = fb.bucket_frame(events), {0: "rank 0", 1: "rank 1"}
    spec = bucket_timeline(with_rank_names(buckets, names), with_rank_names(fb.backward_frame(events, 5), names),
                           with_rank_names(exposed_frame(buckets, events), names), run="r").to_dict()
    backward = spec["datasets"][spec["layer"][0]["data"]["name"]]
    assert sorted((r["lane"], r["start_ms"], r["end_ms"]) for r in backward) == [
        ("rank 0", 0.0, pytest.approx(3.6)), ("rank 1", 0.0, pytest.approx(1.5))]
    assert spec["layer"][0]["encoding"]["x"]["title"] == "ms from each rank's own backward start"


def test_two_ddps_buckets_get_rows_of_their_own_and_the_subtitle_says_whose():
    from ddpviz.app.charts.buckets import bucket_timeline
    from ddpviz.app.frames.buckets import exposed_frame, with_rank_names

    def b(ddp, idx, ready):  # an attached GAN: G's two buckets and D's one, on rank 0
        return dict(type="bucket", step=2, rank=0, ddp_index=ddp, bucket_index=idx, nbytes=1000, num_params=1,
                    ready_s=ready, comm_start_s=ready, comm_end_s=ready + 0.001, is_last=(ddp, idx) == (0, 1))
    events = [b(1, 0, 0.001), b(0, 0, 0.002), b(0, 1, 0.003),
              dict(type="step", step=2, rank=0, backward_s=0.004, comm_exposed_s=0.001)]
    buckets, names = fb.bucket_frame(events), {0: "rank 0"}
    spec = bucket_timeline(with_rank_names(buckets, names), with_rank_names(fb.backward_frame(events, 2), names),
                           with_rank_names(exposed_frame(buckets, events), names), run="GAN").to_dict()
    assert " ".join(spec["title"]["subtitle"]).startswith("3 bucket(s) of 2 DDPs (DDP 0's rows first) per rank")
    rows = {(r["bucket"], r["y0"]) for r in spec["datasets"][spec["layer"][2]["data"]["name"]]}
    assert rows == {("DDP 0 · 0", 0.15), ("DDP 0 · 1", 1.15), ("DDP 1 · 0", 2.15)}  # three rows, none shared
    (labels,) = [layer for layer in spec["layer"] if layer["mark"].get("type") == "text"]
    said = {(d["text"], d["y0"]) for d in spec["datasets"][labels["data"]["name"]]}
    assert said == {("DDP 0", 0.5), ("DDP 1", 2.5)}  # at the middle of each DDP's first row


def test_dp_phase_chart(two_runs):
    dp, _ = two_runs
    spec = _check(charts_dp.dp_phase_chart(fd.dp_phase_frame(dp)), "ms from step start",
                  "device", "phase")
    assert spec["encoding"]["color"]["scale"]["domain"] == fd.DP_PHASES
    assert spec["title"]["text"] == "DP phases"  # no step: the spec stays the same on Live


def test_comm_volume_chart_says_measured_or_derived(two_runs):
    dp, ddp = two_runs
    spec = _check(charts.comm_volume_chart(fsteps.comm_volume_frame(dp)),
                  "sent + received per step (KiB)", "device", "bytes")  # 240000 B: KiB (engine.analysis.byte_unit)
    assert {r["which"]: r["amount"] for r in _data(spec)[0] if r["device"] == "cpu:0"} == pytest.approx(
        {"measured": 240000 / 1024, "theory": 240000 / 1024})
    rows = _data(spec)[0]
    d0 = {r["which"]: r["mib"] for r in rows if r["device"] == "cpu:0"}
    assert d0 == pytest.approx({"measured": 240000 / 2**20, "theory": 240000 / 2**20})
    rows = _data(charts.comm_volume_chart(fsteps.comm_volume_frame(ddp)).to_dict())[0]
    assert {r["which"] for r in rows} == {"derived (ring all-reduce)", "theory"}


def test_no_layer_is_drawn_from_an_empty_dataset(two_runs):
    """A layer with no rows draws nothing and makes Vega warn "Infinite extent" for its fields in
    the browser's console (issue 33's tour, on Live and Theory): the time chart's algbw (none on
    it), an older run's memory step whose readings have no curve (no chart). Live's bins before any
    step is binned are left so, on purpose (`live_throughput_chart`): exactly those two layers."""
    from recorded_frames import load as _load
    from test_app_chart_text import _empty_views, _spec

    from ddpviz.app.charts import theory as charts_theory
    from ddpviz.app.charts.live import live_throughput_chart
    from ddpviz.app.frames import theory as ft
    from ddpviz.app.step_history import StepHistory

    dp, ddp = two_runs
    steps = pd.concat([fsteps.steps_frame(dp, "dp"), fsteps.steps_frame(ddp, "ddp")])
    live = live_throughput_chart(steps, StepHistory().frame("dp"), ["dp", "ddp"], 500)
    assert _empty_views(*_spec("", live)[1:]) == ["a rect of ['color', 'x', 'x2', 'y', 'y2']",
                                                  "a line of ['color', 'detail', 'x', 'y']"]
    events = _load("real_ddp_probe_mlp_ws2.jsonl")  # recorded before memory events had a curve
    probe = ft.latest_probe(events)
    pf, bk = ft.probe_frame(probe), ft.bucket_frame(events, 2)
    lines = ft.model_lines({ft.FIT_PROBE: probe["fit"]}, *ft.size_range(pf, bk), 2)
    old = charts_memory.memory_curve_charts(fm.memory_curve_frame(events, "ddp"),
                                            fm.memory_phase_frame(events, 11), "ddp")
    assert old == []  # its one-off readings are no device's line: no plot of nothing
    charts = [charts_theory.bandwidth_chart(pf, bk, lines, run="DDP"),
              charts_theory.time_chart(pf, bk, lines, run="DDP")]
    empty = {c.to_dict()["title"]["text"]: _empty_views(*_spec("", c)[1:]) for c in charts}
    assert not any(empty.values()), empty


def test_charts_accept_empty_frames():
    # a panel may draw before the first events: no exception, still titled
    for chart in (charts.throughput_curves_chart(fsteps.steps_frame([], "x")),
                  charts_dp.dp_phase_chart(fd.dp_phase_frame([]))):
        assert chart.to_dict()["title"]["text"]


def _recorder_step(spans: bool) -> tuple[list[dict], list[dict]]:
    """One DDP step of 2 ranks, 2 buckets: ready times always (DDP's reducer), all-reduce spans only
    when `spans` (the hook, or a profiled step); exposed comm 1.5 ms (rank 0) and 0.5 ms (rank 1)."""
    from ddpviz.engine.modes.ddp.reducer import READY_SOURCE

    buckets, steps = [], []
    for rank, exposed in ((0, 0.0015), (1, 0.0005)):
        steps.append(dict(type="step", rank=rank, step=7, backward_s=0.0002, comm_exposed_s=exposed))
        for b, ready in ((0, 0.00015), (1, 0.0002)):
            buckets.append(dict(type="bucket", rank=rank, step=7, bucket_index=b, nbytes=4096, num_params=2,
                                ready_s=ready, comm_start_s=ready if spans else None,
                                comm_end_s=0.0002 + exposed if spans else None,
                                source="comm hook (Python): measured" if spans else READY_SOURCE))
    return buckets, steps


def test_a_step_with_ready_times_and_no_spans_shows_its_measured_exposed_comm():
    """bucket_timing=recorder: the exposed band runs from the last ready time for the step's
    measured exposed comm (hand-worked: 0.2 ms + 1.5 ms and + 0.5 ms), not 0 for want of an end."""
    buckets, steps = _recorder_step(spans=False)
    exposed = fb.exposed_frame(fb.bucket_frame(buckets, 7), steps).set_index("rank")
    assert exposed.loc[0, "end_ms"] == pytest.approx(1.7) and exposed.loc[1, "end_ms"] == pytest.approx(0.7)
    assert exposed["exposed_ms"].tolist() == pytest.approx([1.5, 0.5])


def test_the_recorder_steps_subtitle_names_what_is_missing_and_the_plot_keeps_its_height():
    """Its subtitle says the all-reduce start and end are not measured (ready times are) and by whom;
    the chart grows by the extra subtitle lines so the lanes keep their height (a long subtitle
    squeezed the plot to nothing in the browser: every mark drawn in a 0 px band)."""
    from ddpviz.app.charts.buckets import bucket_timeline
    from ddpviz.app.charts.style import TITLE_LINE_PX

    def chart(spans):
        buckets, steps = _recorder_step(spans)
        frame = fb.bucket_frame(buckets, 7).assign(lane=lambda d: "rank " + d["rank"].astype(str))
        back = fb.backward_frame(steps, 7).assign(lane=lambda d: "rank " + d["rank"].astype(str))
        exp = fb.exposed_frame(frame, steps).assign(lane=lambda d: "rank " + d["rank"].astype(str))
        return bucket_timeline(frame, back, exp, run="G", latest=True, lanes=["rank 0", "rank 1"]).to_dict()
    hook, rec = chart(True), chart(False)
    sub = " ".join(rec["title"]["subtitle"])
    assert "all-reduce start and end not measured on this step" in sub and "DDP's reducer" in sub
    extra_lines = len(rec["title"]["subtitle"]) - len(hook["title"]["subtitle"])
    assert extra_lines > 0 and rec["height"] - hook["height"] == TITLE_LINE_PX * extra_lines


def test_the_exposed_band_is_never_under_an_all_reduce_bar():
    """A profiled step: rank 0's only bucket ready at 4.0 ms, all-reduced 4.2-9.1 ms after its backward's end; the
    exposed comm (4.0-9.1 ms) was drawn across the lane under that bar, 0.2 ms of it visible (a new user read
    0.2 ms against the caption's 5.13 ms, 2026-12-06). The band must span the exposed time and share no y with a bar."""
    from ddpviz.app.charts.buckets import bucket_timeline
    from ddpviz.app.frames.buckets import exposed_frame, with_rank_names

    events = [dict(type="bucket", step=1, rank=0, bucket_index=0, nbytes=1000, num_params=2, ready_s=0.0040,
                   comm_start_s=0.0042, comm_end_s=0.0091, is_last=True),
              dict(type="step", step=1, rank=0, backward_s=0.0040, comm_exposed_s=0.0051, backward_start_ts=100.0)]
    names = {0: "rank 0"}
    buckets = with_rank_names(fb.bucket_frame(events), names)
    spec = bucket_timeline(buckets, with_rank_names(fb.backward_frame(events, 1), names),
                           with_rank_names(exposed_frame(fb.bucket_frame(events), events), names), run="DDP").to_dict()
    data = {i: spec["datasets"][layer["data"]["name"]] for i, layer in enumerate(spec["layer"])}
    (band,) = [d for rows_ in data.values() for d in rows_ if d.get("kind") == "exposed comm"]
    bars = [d for rows_ in data.values() for d in rows_ if d.get("kind") == "all-reduce (a bar per bucket)"]
    assert (band["start_ms"], band["end_ms"]) == pytest.approx((4.0, 9.1))
    assert bars and all(band["y1"] <= bar["y0"] or band["y0"] >= bar["y1"] for bar in bars)



def test_side_by_side_timelines_reach_the_end_of_every_exposed_band():
    """bucket_timing=recorder on gloo: ready times and the step's exposed comm, no all-reduce ends. Rank 1's band
    (ready 0.5 ms + 3.17 ms) ran off a shared axis that stopped at the backward's end (a new user, 2026-12-06)."""
    events = [dict(type="bucket", step=27, rank=r, bucket_index=0, nbytes=1000, num_params=2, ready_s=0.0005,
                   comm_start_s=None, comm_end_s=None, is_last=True) for r in (0, 1)]
    events += [dict(type="step", step=27, rank=0, backward_s=0.0008, comm_exposed_s=0.0002, backward_start_ts=1.0),
               dict(type="step", step=27, rank=1, backward_s=0.0008, comm_exposed_s=0.00317, backward_start_ts=1.0)]
    steps = [e for e in events if e["type"] == "step"]
    assert fb.timeline_end_ms(events, steps, 27) == pytest.approx(0.5 + 3.17)
