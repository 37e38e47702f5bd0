"""The links' frames and charts: Theory (bucket and probe bandwidths, the ring fits) and Learn's topology
(who sends whom how many bytes), on recorded real runs (`recorded_frames`) and hand-made events; the
formulas written out here (nccl-tests' busbw, the ring's 2(n-1)/n)."""

import pytest

from ddpviz.app.charts import theory as charts_theory
from ddpviz.app.charts import topology as charts_topology
from ddpviz.app.frames import base as frames
from ddpviz.app.frames import theory as ft
from ddpviz.app.frames import topology as ftop
from recorded_frames import check_chart as _check_chart, ddp_events, load as _load  # noqa: F401 (fixtures)


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


def test_a_latency_on_the_fits_bound_is_not_resolved_and_the_line_stays_on_its_sizes():
    """The probe's widest range was 2-16 MiB, bandwidth-bound: the non-negative fit put the latency at its bound, 0.
    A new user read "α = 0.0 µs per hop" as a measurement, and the dashed line carried down to 4 KiB predicted
    0.005 ms where the probe measured 0.7 ms (2026-12-06). Hand-worked: t = 1.215 ns/B x bytes."""
    mib = 2**20
    pts = [(n * mib, 1.215e-9 * n * mib) for n in (2, 4, 8, 16)]
    from ddpviz.engine import analysis

    fit = analysis.fit_ring_times(pts, 2)
    assert fit["latency_s"] == 0.0 and fit["s_per_byte"] == pytest.approx(1.215e-9)
    words = ft.describe_fit(fit, 2)
    assert "α not resolved" in words and "α = " not in words and "1.215 ns/B" in words
    lines = ft.model_lines({ft.FIT_PROBE: fit}, 4096, 64 * mib, 2)
    assert lines["nbytes"].min() == pytest.approx(2 * mib) and lines["nbytes"].max() == pytest.approx(16 * mib)
    resolved = {**fit, "latency_s": 1e-4, "alpha_s": 5e-5}
    assert ft.describe_fit(resolved, 2).startswith("α = 50.0 µs per hop")


def test_a_fit_far_off_its_own_probe_near_a_size_is_not_carried_there():
    """A probe cut short by its budget fitted 8-32 KiB (latency-bound) and said 16.6 ms at 198 KiB, where it
    measured 0.634 ms; Learn drew its theory on it (a new user, 2026-12-06). Hand-worked line: 0.3 ms + 83 ns/B."""
    kib = 1024
    from ddpviz.engine import analysis

    pts = [{"nbytes": n * kib, "time_s": 3e-4 + 83e-9 * n * kib} for n in (8, 16, 32)]
    fit = analysis.fit_ring_times([(p["nbytes"], p["time_s"]) for p in pts], 2)
    assert fit["latency_s"] == pytest.approx(3e-4) and fit["s_per_byte"] == pytest.approx(83e-9)
    probe = {"fit": fit, "points": [*pts, {"nbytes": 198 * kib, "time_s": 0.634e-3}], "run_nbytes": [198 * kib],
             "backend": "gloo", "iters": 5, "warmup_iters": 1}
    said = 3e-4 + 83e-9 * 198 * kib  # 17.1 ms
    miss = ft.fit_miss(probe, 200 * kib)
    assert miss is not None and f"({said / 0.634e-3:.0f}× off)" in miss and "198 KiB" in miss
    assert ft.fit_miss(probe, 16 * kib) is None  # inside the fitted sizes
    near = {**probe, "points": [*pts, {"nbytes": 198 * kib, "time_s": said / 1.9}]}
    assert ft.fit_miss(near, 200 * kib) is None  # 1.9x: within MISS_FACTOR
    assert "Beware at the run's bucket sizes: the probe's ring fit" in ft.probe_note(probe, 2)


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
