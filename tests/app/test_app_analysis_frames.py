"""The analysis pages' frames and charts for one run set: Compare, the Bucket timeline, the DP timeline and
the exports, on recorded real runs (`recorded_frames`) and on hand-made events. References are independent
of the code under test: the run's own `grad_bytes`, PyTorch's bucket assignment (`bucket_preview`), the
README's formulas written out here."""

import json

import eventgen as g
import pandas as pd
import pytest

from ddpviz.app.charts import buckets as charts_buckets
from ddpviz.app.charts import compare as charts_compare
from ddpviz.app.charts import dp as charts_dp
from ddpviz.app.frames import base as frames
from ddpviz.app.frames import buckets as fb
from ddpviz.app.frames import compare as fc
from ddpviz.app.frames import dp as fd
from ddpviz.app.frames import runs as fruns
from ddpviz.app.window import RunWindow
from ddpviz.engine.export import render
from recorded_frames import P, check_chart as _check_chart, ddp_events, load as _load, trio  # noqa: F401 (fixtures)


# ---- compare --------------------------------------------------------------------------------
def test_compare_frame_speedup_memory_bytes(trio):
    df = fc.compare_frame(trio).set_index("run")
    sps = {v.label: v.summary["samples_per_s"] for v in trio}
    assert df.loc["single", "speedup_vs_single"] == pytest.approx(1.0)
    assert df.loc["DP", "speedup_vs_single"] == pytest.approx(sps["DP"] / sps["single"])
    assert df.loc["DDP", "speedup_vs_single"] == pytest.approx(sps["DDP"] / sps["single"])
    # measured (live tensors): device 0 also holds the master copy, the gathered outputs and the
    # gradients arriving in reduce; DDP's ranks hold the same tensors
    assert df.loc["DP", "memory_imbalance"] > 1.1
    assert df.loc["DDP", "memory_imbalance"] < 1.05
    # ring all-reduce, n = 2: 2(n-1)/n * P each way = P sent + P received
    assert df.loc["DDP", "bytes_mib_max"] == pytest.approx(2 * P / frames.MIB)
    assert df.loc["DDP", "theory_mib_max"] == pytest.approx(2 * P / frames.MIB)
    assert df.loc["DDP", "bytes_source"] == "derived (ring all-reduce)"
    assert df.loc["DP", "bytes_source"] == "measured"
    assert df["replicas_in_sync"].tolist() == [None, True, True]  # single: nothing to compare
    table = fc.side_by_side(fc.compare_frame(trio))
    assert list(table.columns) == ["measure", "single", "DP", "DDP"]
    row = table[table["measure"] == "replicas in sync"].iloc[0]
    assert (row["single"], row["DDP"]) == ("n/a (one device)", "yes")
    assert row["DP"] == "rebuilt each step; as computed with: yes"


def test_bytes_frame_formula_dp_hub(trio):
    vol = fc.bytes_frame(trio[1:])
    theory = vol[vol["which"] == "theory"].set_index(["run", "device"])["mib"]
    # DP: device 0 sends and receives (n-1)*P, the others P; n = 2 so both 2*P in total
    assert theory[("DP", "cpu:0")] == pytest.approx(2 * P / frames.MIB)
    assert theory[("DDP", "rank 1")] == pytest.approx(2 * P / frames.MIB)
    assert set(vol.loc[vol["which"] == "measured", "device"]) == {"cpu:0", "cpu:1"}  # DP's copies
    assert set(vol.loc[vol["which"] == "derived (ring all-reduce)", "device"]) == {"rank 0", "rank 1"}


def test_peak_memory_names_ranks_and_devices(trio):
    peaks = fc.peak_memory_frame(trio)
    assert set(peaks.loc[peaks["run"] == "DDP", "device"]) == {"rank 0", "rank 1"}
    assert set(peaks.loc[peaks["run"] == "DP", "device"]) == {"cpu:0", "cpu:1"}


def test_thin_keeps_last_row():
    df = pd.DataFrame({"step": range(2500)})
    out = fc.thin(df, 1000)
    assert len(out) <= 1000 and out["step"].iloc[-1] == 2499 and out["step"].iloc[0] == 0


def test_compare_charts(trio):
    df = fc.compare_frame(trio)
    curves = fc.curves_frame(trio)
    for chart in (charts_compare.loss_chart(curves), charts_compare.speedup_chart(df),
                  charts_compare.peak_memory_chart(fc.peak_memory_frame(trio)),
                  charts_compare.bytes_chart(fc.bytes_frame(trio))):
        _check_chart(chart)


# ---- buckets --------------------------------------------------------------------------------
def test_window_keeps_first_and_latest_bucket_steps(ddp_events):
    w = RunWindow("x", recent_steps=8, first_steps=2)
    for e in ddp_events:  # one at a time, as a live poll would
        w.ingest([e])
    assert fb.bucket_steps(w.of_type("bucket")) == [0, 1] + list(range(4, 12))


def test_bucket_layouts_match_pytorch_rule(ddp_events):
    preview = ddp_events[0]["bucket_preview"]
    assert len(preview["initial"]) == 1 and len(preview["rebuilt"]) == 3
    assert sum(b["nbytes"] for b in preview["rebuilt"]) == P
    measured = fb.measured_layouts(ddp_events)
    assert sorted(measured) == [0, 1]  # the layout appears at step 0 and changes at step 1
    assert [b["param_names"] for b in measured[1]] == [b["param_names"] for b in preview["rebuilt"]]
    table = fb.layout_frame(preview["rebuilt"])
    assert table["tensors"].tolist() == [4, 2, 2]
    assert table["KiB"].sum() == pytest.approx(P / 1024)
    # a cell holds the first and the last name (all of them up to two); the list under the table every name
    names = [b["param_names"] for b in preview["rebuilt"]]
    assert table["parameters"].tolist() == [f"{n[0]} … {n[-1]}" if len(n) > 2 else ", ".join(n) for n in names]
    assert fb.layout_names(preview["rebuilt"]).count("`") == 2 * sum(map(len, names))
    assert fb.layout_frame([dict(bucket_index=0, nbytes=8, param_names=["a", "b", "c"])])["parameters"][0] == "a … c"


def test_exposed_is_after_last_ready(ddp_events):
    buckets = fb.bucket_frame(ddp_events, 11)
    exp = fb.exposed_frame(buckets, ddp_events).set_index("rank")
    for rank, df in buckets.groupby("rank"):
        assert exp.loc[rank, "start_ms"] == pytest.approx(df["ready_ms"].max())
        # the band is the run's own figure, the same the step split and exports show
        step = next(e for e in ddp_events if e["type"] == "step" and e["step"] == 11 and e.get("rank", 0) == rank)
        assert exp.loc[rank, "exposed_ms"] == pytest.approx(step["comm_exposed_s"] * 1e3)
        # which also waits for the futures and copies back: never less than the last all-reduce end
        assert exp.loc[rank, "end_ms"] >= df["comm_end_ms"].max() - 0.5


def test_rank_names_with_hosts():
    evs = [{"type": "step", "rank": 0, "host": "gpu-a"}, {"type": "step", "rank": 1,
                                                          "host": "gpu-b"}]
    assert fb.rank_names(evs) == {0: "rank 0 @ gpu-a", 1: "rank 1 @ gpu-b"}
    assert fb.rank_names([{"type": "step", "rank": 0}]) == {0: "rank 0"}


def test_bucket_timeline_chart(ddp_events):
    names = fb.rank_names(ddp_events)
    buckets = fb.with_rank_names(fb.bucket_frame(ddp_events, 5), names)
    backward = fb.with_rank_names(fb.backward_frame(ddp_events, 5), names)
    exposed = fb.with_rank_names(fb.exposed_frame(buckets, ddp_events), names)
    spec = _check_chart(charts_buckets.bucket_timeline(buckets, backward, exposed, run="DDP",
                                                       x_max_ms=20.0))
    assert spec["title"]["text"] == "DDP: step 5"
    per_step = fb.exposed_per_step(ddp_events, "DDP")
    assert per_step["step"].tolist() == list(range(12))
    _check_chart(charts_buckets.exposed_chart(per_step))


# ---- DP --------------------------------------------------------------------------------------
def test_idle_on_hand_made_step():
    phases = fd.dp_phase_frame(g.dp_step("r", 0), 0)
    idle = fd.idle_summary(phases).set_index("device")
    # eventgen: 8 phases back to back over 32 ms; device 1 skips the 4 ms optimizer phase
    assert idle.loc["cpu:0", "idle_ms"] == pytest.approx(0.0)
    assert idle.loc["cpu:1", "idle_ms"] == pytest.approx(4.0)
    assert idle.loc["cpu:1", "idle_pct"] == pytest.approx(12.5)
    gaps = fd.idle_frame(phases)
    assert gaps[["device", "start_ms", "end_ms"]].values.tolist() == [["cpu:1", 28.0, 32.0]]


def test_dp_real_run_timeline():
    events = _load("real_dp_mlp_ws2.jsonl")
    steps = fd.dp_steps(events)
    assert steps == list(range(12))
    phases = fd.dp_phase_frame(events, steps[-1])
    summary = fd.idle_summary(phases).set_index("device")
    # reference from the raw events: the step spans [0, the latest end on any device]; a device
    # is idle wherever none of its phases covers it (a sweep over its interval ends, by hand)
    raw = [e for e in events if e["type"] == "dp_phase" and e["step"] == steps[-1]]
    span_ms = 1000.0 * max(e["end_s"] for e in raw)
    for device in {e["device"] for e in raw}:
        marks = sorted([(1000.0 * e["start_s"], 1) for e in raw if e["device"] == device]
                       + [(1000.0 * e["end_s"], -1) for e in raw if e["device"] == device])
        covered, depth, since = 0.0, 0, 0.0
        for t, d in marks:
            if depth > 0:
                covered += t - since
            depth, since = depth + d, t
        idle_ms = span_ms - covered
        assert summary.loc[device, "idle_ms"] == pytest.approx(idle_ms, abs=0.01), device
        assert summary.loc[device, "idle_pct"] == pytest.approx(100 * idle_ms / span_ms, abs=0.05), device
    assert summary["idle_ms"].max() > 0  # a real DP step: some device waited for another
    totals = fd.phase_totals(events, steps)
    assert "optimizer" in set(totals.loc[totals["device"] == "cpu:0", "phase"])
    _check_chart(charts_dp.dp_timeline(phases, fd.idle_frame(phases), summary.reset_index(), run="DP"))
    _check_chart(charts_dp.phase_totals_chart(totals, run="DP"))


# ---- runs and exports ------------------------------------------------------------------------
def test_filter_runs():
    df = fruns.runs_frame([
        {"run_id": "a1", "label": "DDP", "status": "succeeded", "created_at": 3,
         "config": {"mode": "ddp", "model": "mlp"}},
        {"run_id": "b2", "label": "", "status": "failed", "created_at": 2,
         "config": {"mode": "dp", "model": "gpt"}},
        {"run_id": "c3", "label": "mine", "status": "lost", "created_at": 1,
         "config": {"mode": "ddp", "model": "gpt"}}])
    assert fruns.filter_runs(df)["run_id"].tolist() == ["a1", "b2", "c3"]
    assert fruns.filter_runs(df, modes=["ddp"])["run_id"].tolist() == ["a1", "c3"]
    assert fruns.filter_runs(df, statuses=["lost", "failed"], models=["gpt"])["run_id"].tolist() \
        == ["b2", "c3"]
    assert fruns.filter_runs(df, text="MINE")["run_id"].tolist() == ["c3"]


def test_exports_render(ddp_events):
    lines = render(ddp_events, "jsonl").splitlines()
    assert [json.loads(x) for x in lines] == ddp_events
    csv_rows = render(ddp_events, "csv").splitlines()
    assert len(csv_rows) == 1 + len(frames.of_type(ddp_events, "step"))
    trace = json.loads(render(ddp_events, "trace"))
    tracks = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
    assert tracks == {"rank 0 (cpu:0)", "rank 1 (cpu:1)"}
    with pytest.raises(ValueError):
        render(ddp_events, "xml")
