"""The fleet's frames and charts: Sweeps (efficiency, bucket sweeps) and Cluster (workers, GPUs, the runs
on each worker over time), on hand-made records with answers worked out by hand."""

import os

import pytest

from ddpviz.app.charts import cluster as charts_cluster
from ddpviz.app.charts import sweeps as charts_sweeps
from ddpviz.app.frames import cluster as fcl
from ddpviz.app.frames import sweeps as fs
from ddpviz.workers import heartbeat as workers_heartbeat
from recorded_frames import check_chart as _check_chart  # noqa: F401 (fixtures)


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
    # DP has no all-reduce: no overlap figure, where its summary's 0 read "overlap 0%"
    dp = fs.sweep_frame([{**_rec("d", "dp", 2, 900.0), "summary": {"samples_per_s": 900.0, "overlap": 0.0}}])
    assert dp["overlap_frac"].isna().all()
    ddp = fs.sweep_frame([{**_rec("e", "ddp", 2, 900.0), "summary": {"samples_per_s": 900.0, "overlap": 0.5}}])
    assert ddp["overlap_frac"].tolist() == [0.5]
    _check_chart(charts_sweeps.efficiency_chart(eff.reset_index()))
    # the legend names the modes drawn (single and ddp here), not every mode the app knows
    spec = charts_sweeps.efficiency_chart(eff.reset_index()).to_dict()
    assert spec["layer"][0]["encoding"]["color"]["scale"]["domain"] == ["single", "ddp"]
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
    assert df["devices"].tolist() == ["2 × H100", "none reported"]
    # a CPU host as detect_devices reports it: one CPU whatever the ranks (gloo ranks share its cores), not "1 × cpu"
    cpu_host = workers_heartbeat.detect_devices()
    assert fcl.devices_text(cpu_host[:1]) == f"CPU ({os.cpu_count()} cores)"
    assert fcl.devices_text([{"kind": "cpu", "cores": 16}, {"kind": "cuda", "name": "NVIDIA H100"},
                             {"kind": "cuda", "name": "NVIDIA H100"}, {"kind": "cuda", "name": "NVIDIA A10"}]) \
        == "CPU (16 cores) + 2 × NVIDIA H100 + 1 × NVIDIA A10"
    assert df["gpus"].iloc[1] == "CPU only"
    # a pair in turns: two ids, each named by its label where known (raw "44bb…,ed8a…" before)
    pair = fcl.workers_frame([{**GPU_WORKER, "current_run": "44bb9120bbbe439a,ed8a3f146f614b45"}], now=103.0,
                             labels={"44bb9120bbbe439a": "p2 · DP", "ed8a3f146f614b45": ""})
    assert pair["current_run"].iloc[0] == "p2 · DP (44bb9120), ed8a3f146f614b45"
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
    # a window from 48 s: dp1 ended at 47 (left out), ddp1 still ran at 48 (kept, with its own slot), s1 after
    late = fcl.worker_runs_frame([{"run_id": r, "worker": w, "started_at": a, "finished_at": b,
                                   "config": {"mode": m}} for r, m, a, b, w in both], now=60, since=48.0)
    assert sorted(zip(late["run"].str.split(" · ").str[1], late["slot"])) == [("ddp1", 0), ("o1", 0), ("s1", 0)]
    # the chart's axis spans the window, named in its subtitle; without one it fits the runs
    import datetime as dt

    a, b = dt.datetime.fromtimestamp(48.0), dt.datetime.fromtimestamp(60.0)
    spec = charts_cluster.worker_runs_chart(late, (a, b, "12 s")).to_dict()
    assert spec["encoding"]["x"]["scale"]["domain"] == [a.isoformat(), b.isoformat()]
    assert "the last 12 s" in spec["title"]["subtitle"][0]
    assert "scale" not in charts_cluster.worker_runs_chart(late).to_dict()["encoding"]["x"]
    # a 1-hour window whose runs all fell in its last 3 minutes: the axis starts 10 s (at least, 5% of what is
    # shown) before the first run, not an hour back; runs older than the window leave it at the window's start
    now = 10_000.0
    recent = fcl.worker_runs_frame([{"run_id": "r", "worker": "w", "started_at": now - 180, "finished_at": now - 170,
                                     "config": {"mode": "ddp"}}], now=now, since=now - 3600)
    assert fcl.runs_axis(recent, now, 3600) == (dt.datetime.fromtimestamp(now - 190), dt.datetime.fromtimestamp(now))
    old = fcl.worker_runs_frame([{"run_id": "r", "worker": "w", "started_at": now - 7200, "finished_at": now - 100,
                                  "config": {"mode": "ddp"}}], now=now, since=now - 3600)
    assert fcl.runs_axis(old, now, 3600)[0] == dt.datetime.fromtimestamp(now - 3600)
    assert fcl.runs_axis(recent.iloc[:0], now, 3600)[0] == dt.datetime.fromtimestamp(now - 3600)
