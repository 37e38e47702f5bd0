"""The analysis pages' frames and charts, on recorded real runs and on hand-made events.

Recorded runs (tests/app/data, see test_app_real_run.py): mlp on digits, world_size 2, width 256,
12 steps, bucket_cap_mb 0.1 (3 buckets after the rebuild), as single, DP, DDP and DDP with
overlap off. References are independent of the code under test: the run's own `grad_bytes`,
PyTorch's bucket assignment (`bucket_preview`), the README's formulas written out here.
"""

import json
from pathlib import Path

import eventgen as g
import pandas as pd
import pytest

from ddpviz.app.charts import buckets as charts_buckets
from ddpviz.app.charts import cluster as charts_cluster
from ddpviz.app.charts import compare as charts_compare
from ddpviz.app.charts import dp as charts_dp
from ddpviz.app.charts import sweeps as charts_sweeps
from ddpviz.app.charts import theory as charts_theory
from ddpviz.app.charts import topology as charts_topology
from ddpviz.app.charts.style import MAX_POINTS
from ddpviz.app.frames import base as frames
from ddpviz.app.frames import buckets as fb
from ddpviz.app.frames import cluster as fcl
from ddpviz.app.frames import compare as fc
from ddpviz.app.frames import dp as fd
from ddpviz.app.frames import runs as fruns
from ddpviz.app.frames import sweeps as fs
from ddpviz.app.frames import theory as ft
from ddpviz.app.frames import topology as ftop
from ddpviz.app.window import RunWindow
from ddpviz.engine.export import render

DATA = Path(__file__).parent / "data"
P = 603176  # gradient bytes of the recorded model (run_started.grad_bytes)


def _load(name: str) -> list[dict]:
    with open(DATA / name, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _view(name: str, label: str) -> fc.RunView:
    events = _load(name)
    w = RunWindow(label, recent_steps=8, first_steps=2)
    w.ingest(events)
    w.run = {"config": events[0]["config"], "status": "succeeded",
             "summary": events[-1]["summary"]}
    return fc.view_of(w, label)


@pytest.fixture(scope="module")
def trio():
    return [_view("real_single_mlp_ws2.jsonl", "single"), _view("real_dp_mlp_ws2.jsonl", "DP"),
            _view("real_ddp_mlp_ws2.jsonl", "DDP")]


@pytest.fixture(scope="module")
def ddp_events():
    return _load("real_ddp_mlp_ws2.jsonl")


def _check_chart(chart) -> dict:
    """Every chart: a title, axis titles on its positional encodings, a legend, bounded data."""
    spec = chart.to_dict()
    assert spec["title"]["text"]
    layers = spec.get("layer", [spec])
    encs = [layer.get("encoding", {}) for layer in layers]
    for axis in ("x", "y"):
        shown = [e[axis] for e in encs if axis in e and e[axis].get("axis", {}) is not None
                 and e[axis].get("type") == "quantitative"]
        if shown:  # the layers share the axis: one of them names it (with its unit)
            assert any(e.get("title") for e in shown), f"{axis} axis without a title"
    assert any(k in e for e in encs for k in ("color", "size", "shape")), "no legend channel"
    rows = sum(len(v) for v in spec.get("datasets", {}).values())
    assert rows <= MAX_POINTS
    return spec


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
        assert exp.loc[rank, "end_ms"] == pytest.approx(max(df["comm_end_ms"].max(),
                                                            df["ready_ms"].max()))
        # the engine's exposed time also waits for the futures and copies back: never less
        assert exp.loc[rank, "exposed_ms"] <= exp.loc[rank, "reported_ms"] + 0.5


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


# ---- theory ----------------------------------------------------------------------------------
def _bucket(step, idx, nbytes, start, end, rank=0):
    return {"type": "bucket", "step": step, "rank": rank, "bucket_index": idx, "nbytes": nbytes,
            "comm_start_s": start, "comm_end_s": end}


def test_bucket_frame_busbw_and_alone_on_the_recorded_run(ddp_events):
    bw = ft.bucket_frame(ddp_events, 2)
    assert len(bw) == sum(1 for e in ddp_events if e["type"] == "bucket")
    ok = bw.dropna()
    assert (ok["busbw_gbps"] / ok["algbw_gbps"]).round(9).unique().tolist() == [1.0]  # n = 2
    assert ok["algbw_gbps"].tolist() == pytest.approx(
        (ok["nbytes"] / (ok["time_ms"] / 1e3) / 1e9).tolist())
    assert set(bw["series"]) <= {ft.ALONE, ft.OVERLAPPED}
    assert (bw["series"] == ft.ALONE).tolist() == bw["alone"].tolist()


def test_bucket_fit_uses_only_buckets_that_ran_alone():
    a, c = 0.002, 1e-9  # 2 ms latency, 1 ns/byte
    evs, t = [], 0.0
    for step in (0, 1, 2):
        for i, n in enumerate((1_000_000, 3_000_000, 5_000_000)):
            start, t = t, t + a + c * n  # one after another: each ran alone
            evs.append(_bucket(step, i, n, start, t))
    evs.append(_bucket(2, 3, 5_000_000, t - 0.001, t + 1.0))  # overlaps the last: would spoil it
    model, counts = ft.bucket_fit(evs, 4)
    assert counts == dict(timed=10, warmup=3, overlapped=2, used=5)
    assert model["latency_s"] == pytest.approx(a) and model["s_per_byte"] == pytest.approx(c)
    assert model["beta_bytes_per_s"] == pytest.approx((2 * 3 / 4) / c)
    assert "GB/s" in ft.describe_fit(model, 4)
    assert "5 ran alone. Ring model fitted to those 5" in ft.bucket_note(model, counts, 4)
    assert "2 overlapped another bucket" in ft.bucket_note(model, counts, 4)


def test_model_lines_follow_the_ring_formula():
    model = {"latency_s": 1e-3, "s_per_byte": 1e-9}
    lines = ft.model_lines({ft.FIT_PROBE: model, ft.FIT_BUCKETS: None}, 1024, 2**20, 4)
    assert set(lines["series"]) == {ft.FIT_PROBE} and len(lines) == ft.LINE_POINTS
    last = lines.iloc[-1]
    assert last["nbytes"] == pytest.approx(2**20)
    assert last["time_ms"] == pytest.approx((1e-3 + 1e-9 * 2**20) * 1e3)
    assert last["busbw_gbps"] == pytest.approx(1.5 * 2**20 / (1e-3 + 1e-9 * 2**20) / 1e9)
    flat = {"latency_s": 1e-3, "s_per_byte": 0.0}  # no β: not drawn (busbw would grow unbounded)
    assert ft.model_lines({ft.FIT_BUCKETS: flat}, 1024, 2**20, 4).empty


def test_probe_frame_and_notes_on_the_recorded_probe():
    events = _load("real_ddp_probe_mlp_ws2.jsonl")
    probe = ft.latest_probe(events)
    pf = ft.probe_frame(probe)
    assert pf["nbytes"].tolist() == [p["nbytes"] for p in probe["points"]]
    assert pf.loc[pf["fitted"], "nbytes"].tolist() == probe["fit"]["points_used"]
    note = ft.probe_note(probe, 2)
    assert f"median of {probe['iters']}" in note and "Skipped by the" in note
    summary = ft.ratio_summary(events, probe, 2)
    assert summary["median_alone"] is not None and summary["n_alone"] > 0
    assert ft.probe_frame(None).empty and ft.latest_probe(_load("real_ddp_mlp_ws2.jsonl")) is None
    made = {"type": "allreduce_probe", "fit": {"points_used": [8192]},
            "points": [{"nbytes": b, "time_s": 1e-3, "algbw_bytes_per_s": b / 1e-3,
                        "busbw_bytes_per_s": b / 1e-3} for b in (4096, 8192, 16384)]}
    pf = ft.probe_frame(made)
    assert pf["fitted"].tolist() == [False, True, False]
    assert pf["busbw_gbps"].tolist() == pytest.approx([4.096e-3, 8.192e-3, 16.384e-3])


def test_theory_charts_label_measured_and_fitted(ddp_events):
    events = _load("real_ddp_probe_mlp_ws2.jsonl")
    probe = ft.latest_probe(events)
    pf, bk = ft.probe_frame(probe), ft.bucket_frame(events, 2)
    model, _ = ft.bucket_fit(events, 2)
    lines = ft.model_lines({ft.FIT_PROBE: probe["fit"], ft.FIT_BUCKETS: model},
                           *ft.size_range(pf, bk), 2)
    for chart in (charts_theory.bandwidth_chart(pf, bk, lines, run="DDP"),
                  charts_theory.time_chart(pf, bk, lines, run="DDP"),
                  charts_theory.time_chart(ft.probe_frame(None), ft.bucket_frame(ddp_events, 2),
                                           lines.iloc[0:0], run="DDP")):
        spec = _check_chart(chart)
        domain = {s for layer in spec["layer"] for s in layer["encoding"]["color"]["scale"]["domain"]}
        assert all("(measured" in s or "(fitted model)" in s for s in domain), domain


# ---- sweeps ----------------------------------------------------------------------------------
def _rec(rid, mode, n, sps, cap=25.0, status="succeeded"):
    return {"run_id": rid, "label": f"{mode} ×{n}", "status": status,
            "config": {"mode": mode, "world_size": n, "bucket_cap_mb": cap, "overlap": True},
            "summary": {"samples_per_s": sps, "step_time_s": 64 / sps if sps else None,
                        "comm_exposed_s": 0.001} if sps else None}


def test_efficiency_frame():
    df = fs.sweep_frame([_rec("s", "single", 2, 1000.0), _rec("a", "ddp", 2, 1800.0),
                         _rec("b", "ddp", 4, 3000.0), _rec("c", "dp", 4, None, status="started")])
    eff = fs.efficiency_frame(df).set_index("label")
    assert eff.loc["single ×2", "world_size"] == 1  # single is one device whatever its config
    assert eff.loc["single ×2", "efficiency"] == pytest.approx(1.0)
    assert eff.loc["ddp ×2", "efficiency"] == pytest.approx(1800 / (2 * 1000))
    assert eff.loc["ddp ×4", "efficiency"] == pytest.approx(3000 / (4 * 1000))
    assert "dp ×4" not in eff.index  # not finished
    _check_chart(charts_sweeps.efficiency_chart(eff.reset_index()))
    _check_chart(charts_sweeps.throughput_vs_world_chart(eff.reset_index()))


def test_bucket_sweep_frame_and_values():
    df = fs.sweep_frame([_rec("a", "ddp", 2, 2000.0, cap=0.1), _rec("b", "ddp", 2, 1000.0,
                                                                      cap=25.0)])
    long = fs.bucket_sweep_frame(df)
    step = long[long["which"] == "step time"]
    assert step["bucket_cap_mb"].tolist() == [0.1, 25.0]
    assert step["ms"].tolist() == pytest.approx([32.0, 64.0])
    _check_chart(charts_sweeps.bucket_sweep_chart(long))
    assert fs.parse_values("1, 2,4", "world_size") == [1, 2, 4]
    assert fs.parse_values("0.01,25", "bucket_cap_mb") == [0.01, 25.0]
    for bad, kind in (("0", "world_size"), ("1.5", "world_size"), ("x", "bucket_cap_mb"),
                      ("-1", "bucket_cap_mb"), ("", "world_size")):
        with pytest.raises(ValueError):
            fs.parse_values(bad, kind)


# ---- cluster ---------------------------------------------------------------------------------
GPU_WORKER = {"name": "gpu-box", "host": "h1", "pid": 7, "ts": 100.0, "state": "busy",
              "current_run": "abc", "devices": [{"name": "H100", "kind": "cuda"}] * 2,
              "gpus": [{"index": i, "name": "H100", "memory_used_bytes": (i + 1) * 2 ** 30,
                        "memory_total_bytes": 80 * 2 ** 30, "utilization_pct": 50 * i}
                       for i in range(2)]}


def test_cluster_frames():
    df = fcl.workers_frame([GPU_WORKER, {"name": "cpu", "ts": 99.0, "devices": []}], now=103.0)
    assert df["heartbeat_age_s"].tolist() == [3.0, 4.0]
    assert df["devices"].tolist() == ["2 × cuda", "none reported"]
    assert df["gpus"].iloc[1] == "CPU only"
    gpus = fcl.gpu_frame([GPU_WORKER])
    assert gpus["used_gib"].tolist() == [1.0, 2.0] and gpus["total_gib"].tolist() == [80.0, 80.0]
    _check_chart(charts_cluster.gpu_memory_chart(gpus))
    runs = fcl.worker_runs_frame([{"run_id": "r1", "worker": "w", "started_at": 10.0,
                                   "finished_at": 20.0, "config": {"mode": "ddp"}},
                                  {"run_id": "r2", "worker": None, "started_at": None}], now=30)
    assert len(runs) == 1 and (runs["end"] - runs["start"]).iloc[0].total_seconds() == 10
    _check_chart(charts_cluster.worker_runs_chart(runs))
    # a pair on one worker: both runs over the same seconds, each its own bar in the worker's lane
    # then a single run after it, and one on another worker at the same time: slots 0, 1, 0, 0
    both = (("dp1", "dp", 10.0, 47.0, "w"), ("ddp1", "ddp", 10.0, 50.0, "w"), ("s1", "single", 55.0, 58.0, "w"),
            ("o1", "ddp", 10.0, 50.0, "v"))
    pair = fcl.worker_runs_frame([{"run_id": r, "worker": w, "started_at": a, "finished_at": b,
                                   "config": {"mode": m}} for r, m, a, b, w in both], now=60)
    got = sorted(zip(pair["run"].str.split(" · ").str[1], pair["slot"]))
    assert got == [("ddp1", 1), ("dp1", 0), ("o1", 0), ("s1", 0)]
    enc = charts_cluster.worker_runs_chart(pair).to_dict()["encoding"]
    assert enc["y"]["field"] == "worker" and enc["yOffset"]["field"] == "slot"


# ---- topology --------------------------------------------------------------------------------
def _vol(device, rank, sent, recv):
    return {"type": "comm_volume", "step": 3, "device": device, "rank": rank,
            "sent_bytes": sent, "recv_bytes": recv}


def test_star_links_carry_each_device_bytes():
    mib = frames.MIB
    vol = [_vol("cuda:0", 0, 2 * mib, 2 * mib), _vol("cuda:1", 0, mib, mib),
           _vol("cuda:2", 0, mib, 3 * mib)]
    nodes, edges = ftop.star(ftop.latest_volume(vol))
    assert nodes.loc[0, ["x", "y"]].tolist() == [0.0, 0.0]  # the hub in the centre
    assert edges["link"].tolist() == ["cuda:0 ↔ cuda:1", "cuda:0 ↔ cuda:2"]
    assert edges["mib"].tolist() == [2.0, 4.0]


def test_ring_links_follow_rank_order_and_do_not_overlap():
    vol = [_vol(f"cpu:{r}", r, frames.MIB, frames.MIB) for r in (1, 0)]
    nodes, edges = ftop.ring(ftop.latest_volume(vol), {0: "rank 0 @ a", 1: "rank 1 @ b"})
    assert nodes["label"].tolist() == ["rank 0 @ a", "rank 1 @ b"]
    assert edges["link"].tolist() == ["rank 0 → rank 1", "rank 1 → rank 0"]
    assert edges["mib"].tolist() == [1.0, 1.0]
    assert edges.loc[0, "x"] != pytest.approx(edges.loc[1, "x2"])  # shifted apart for n = 2
    spec = _check_chart(charts_topology.topology_chart(nodes, edges, heading="ring",
                                                       subtitle="s", arrows=True))
    assert spec["autosize"]["type"] == "pad"
    # the legend names what is drawn: ranks, no hub or replicas on a ring (seen in a fresh user's tour)
    roles = [layer["encoding"]["color"]["scale"]["domain"] for layer in spec["layer"]
             if "color" in layer.get("encoding", {}) and layer["encoding"]["color"].get("field") == "role"]
    assert roles == [["rank"]]
    star_nodes, star_edges = ftop.star([_vol(f"cpu:{d}", 0, frames.MIB, frames.MIB) for d in (0, 1)])
    star = charts_topology.topology_chart(star_nodes, star_edges, heading="star", subtitle="s").to_dict()
    assert [layer["encoding"]["color"]["scale"]["domain"] for layer in star["layer"]
            if layer["encoding"].get("color", {}).get("field") == "role"] == [ftop.ROLES[:2]]


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


def test_the_bandwidth_chart_says_when_busbw_lies_on_algbw():
    """A real 2-rank probe: busbw = algbw (factor 2(n-1)/n = 1), so the subtitle says one line hides the
    other; with busbw made 1.5x algbw (as at n = 4) it does not."""
    events = _load("real_ddp_probe_mlp_ws2.jsonl")
    probe = ft.latest_probe(events)
    pf, bk = ft.probe_frame(probe), ft.bucket_frame(events, 2)
    model, _ = ft.bucket_fit(events, 2)
    lines = ft.model_lines({ft.FIT_PROBE: probe["fit"], ft.FIT_BUCKETS: model}, *ft.size_range(pf, bk), 2)
    for factor, said in ((1.0, True), (1.5, False)):
        frame = pf.assign(busbw_gbps=pf["algbw_gbps"] * factor)
        spec = charts_theory.bandwidth_chart(frame, bk, lines, run="DDP").to_dict()
        assert ("one line lies on the other" in " ".join(spec["title"]["subtitle"])) is said
