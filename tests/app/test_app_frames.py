"""Event lists -> DataFrames: values checked against the numbers the events carry."""

import math

import eventgen as g
import pandas as pd
import pytest

from ddpviz.app.frames import base as frames
from ddpviz.app.frames import buckets as fb
from ddpviz.app.frames import dp as fd
from ddpviz.app.frames import memory as fm
from ddpviz.app.frames import runs as fruns
from ddpviz.app.frames import steps as fsteps


def test_steps_frame_ddp_takes_the_mean_over_ranks():
    """Rank 0's steps take 20 ms, rank 1's 21 ms: each rank's times add up to the run's wall
    time, so the step is (20 + 21) / 2 = 20.5 ms and 64 samples / 20.5 ms (not the slowest
    rank's 21 ms, which biases every step up)."""
    events = [e for s in range(3) for e in g.ddp_step("r", s)]
    df = fsteps.steps_frame(events, "ddp")
    assert list(df["step"]) == [0, 1, 2]
    assert df["step_time_ms"].tolist() == pytest.approx([20.5] * 3)
    assert df["samples_per_s"].tolist() == pytest.approx([64 / 0.0205] * 3)
    assert df["forward_ms"].tolist() == pytest.approx([4.0] * 3)
    assert df["comm_exposed_ms"].tolist() == pytest.approx([2.0] * 3)
    assert set(df["run"]) == {"ddp"}
    assert list(df.columns) == fsteps.STEP_COLUMNS


def test_steps_frame_rolling_median():
    events = [e for s in range(12) for e in g.dp_step("r", s)]
    for e in events:
        if e["type"] == "step" and e["step"] == 4:
            e["step_time_s"] = 0.064  # one slow step: half the throughput
    df = fsteps.steps_frame(events, "dp")
    assert df.loc[4, "samples_per_s"] == pytest.approx(1000.0)
    assert df["samples_per_s_smooth"].tolist() == pytest.approx([2000.0] * 12)  # median ignores it


def test_steps_frame_empty_has_columns():
    df = fsteps.steps_frame([], "x")
    assert df.empty and list(df.columns) == fsteps.STEP_COLUMNS


def test_split_frame_medians_and_other_after_warmup():
    events = [e for s in range(4) for e in g.dp_step("r", s)]
    steps = fsteps.steps_frame(events, "dp")
    steps.loc[steps["step"] == 0, "step_time_ms"] = 500.0  # a slow first step is ignored
    split = fsteps.split_frame(steps)
    got = dict(zip(split["part"], split["ms"]))
    assert got == pytest.approx({"forward": 6.0, "backward": 10.0, "exposed comm": 9.0,
                                 "optimizer": 4.0, "other": 3.0})
    assert list(split["order"]) == [fsteps.SPLIT_PARTS.index(p) for p in
                                    ["forward", "backward", "exposed comm", "optimizer", "other"]]


def test_split_frame_two_runs():
    dp = fsteps.steps_frame([e for s in range(3) for e in g.dp_step("a", s)], "dp")
    ddp = fsteps.steps_frame([e for s in range(3) for e in g.ddp_step("b", s)], "ddp")
    split = fsteps.split_frame(pd.concat([dp, ddp]))
    assert split.groupby("run", sort=False)["ms"].sum().to_dict() == pytest.approx(
        {"dp": 32.0, "ddp": 20.5})


def test_memory_curve_frame_latest_traced_step_in_mib_and_ms():
    events = [e for s in range(2) for e in g.dp_step("r", s)]
    df = fm.memory_curve_frame(events, "dp")
    assert set(df["step"]) == {1}
    d0 = df[(df["device"] == "cpu:0") & (df["source"] == "tensors")]
    assert d0["t_ms"].tolist() == pytest.approx([0.0, 6.0, 20.0])
    assert d0["mib"].tolist() == pytest.approx([2.0, 4.0, 2.0])
    # one process holds both virtual devices: its RSS appears once, not per device
    proc = df[df["source"] == "process"]
    assert set(proc["device"]) == {fm.SHARED_PROCESS} and len(proc) == 2
    assert set(df["source_label"]) == {fm.SOURCE_LABELS["tensors"], fm.SOURCE_LABELS["process"]}


def test_latest_traced_step_waits_for_every_rank():
    events = g.ddp_step("r", 0) + [e for e in g.ddp_step("r", 1) if e.get("rank") == 0]
    assert fm.latest_traced_step(events) == 0
    assert fm.latest_traced_step([]) is None


def test_memory_phases_and_peaks():
    events = g.dp_step("r", 0)
    phases = fm.memory_phase_frame(events, 0)
    assert phases["phase"].tolist()[:2] == ["broadcast", "scatter"]
    assert phases["end_ms"].max() == pytest.approx(32.0)
    peaks = fm.memory_peak_frame(events, "dp")
    assert peaks.set_index("device")["peak_mib"].to_dict() == {"cpu:0": 4.0, "cpu:1": 2.0}
    assert "imbalance max/min 2.00×" in fm.peak_caption(peaks)


def test_latest_complete_step_skips_half_delivered_step():
    events = g.ddp_step("r", 0) + g.ddp_step("r", 1) + g.ddp_step("r", 2, complete=False)
    assert frames.latest_complete_step(events, "bucket") == 1
    assert frames.latest_complete_step(g.ddp_step("r", 5, complete=False), "bucket") == 5
    assert frames.latest_complete_step([], "bucket") is None


def test_bucket_frame_ms_and_algbw():
    events = g.ddp_step("r", 0) + g.ddp_step("r", 1)
    df = fb.bucket_frame(events)
    assert set(df["step"]) == {1}
    assert len(df) == 6  # 3 buckets x 2 ranks
    b0 = df[(df["rank"] == 0) & (df["bucket_index"] == 0)].iloc[0]
    assert b0["ready_ms"] == pytest.approx(2.0)
    assert b0["comm_start_ms"] == pytest.approx(3.0)
    assert b0["comm_end_ms"] == pytest.approx(4.5)
    assert b0["comm_ms"] == pytest.approx(1.5)
    assert b0["algbw_gbps"] == pytest.approx(40000 / 0.0015 / 1e9)
    assert b0["mib"] == pytest.approx(40000 / 2**20)


def test_bucket_frame_takes_a_gpu_duration_without_a_span_and_keeps_the_host_launch_apart():
    """A CUDA no-hook step: host launch (`enqueue_s`) and, on a sampled NCCL step, GPU duration
    (`comm_duration_s`), no span: the frame has the duration and bandwidth, and no start or end."""
    ev = dict(type="bucket", run_id="r", step=3, rank=0, bucket_index=0, nbytes=3_000_000, num_params=2,
              ready_s=None, comm_start_s=None, comm_end_s=None, enqueue_s=0.0125, comm_duration_s=0.0015,
              source="flight recorder: bytes, host enqueue time and GPU duration")
    (b,) = fb.bucket_frame([ev]).itertuples()
    assert math.isnan(b.comm_start_ms) and math.isnan(b.comm_end_ms) and math.isnan(b.ready_ms)
    assert b.comm_ms == pytest.approx(1.5) and b.algbw_gbps == pytest.approx(2.0)
    assert b.enqueue_ms == pytest.approx(12.5)


def test_bucket_frame_keeps_two_ddps_buckets_apart_in_rows_of_their_own():
    # an attached GAN: G's bucket 0 and 1, D's bucket 0, on two ranks, in one backward
    def b(rank, ddp, idx, ready):
        return dict(type="bucket", step=4, rank=rank, ddp_index=ddp, bucket_index=idx, nbytes=1000,
                    num_params=1, ready_s=ready, comm_start_s=ready, comm_end_s=ready + 0.001,
                    is_last=(ddp, idx) == (0, 1))
    events = [b(r, d, i, t) for r in (0, 1) for d, i, t in ((1, 0, 0.001), (0, 0, 0.002), (0, 1, 0.003))]
    df = fb.bucket_frame(events)
    assert len(df) == 6
    r0 = df[df["rank"] == 0]
    assert list(zip(r0["ddp_index"], r0["bucket_index"], r0["row"], r0["bucket"])) == [
        (0, 0, 0, "DDP 0 · 0"), (0, 1, 1, "DDP 0 · 1"), (1, 0, 2, "DDP 1 · 0")]
    one = fb.bucket_frame([e for e in events if e["ddp_index"] == 0])  # one DDP: plain names
    assert list(one[one["rank"] == 0]["bucket"]) == ["0", "1"]


def test_backward_frame():
    df = fb.backward_frame(g.ddp_step("r", 3), 3)
    assert df["end_ms"].tolist() == pytest.approx([8.0, 8.0])
    assert df["rank"].tolist() == [0, 1]


def test_dp_phase_frame_orders_phases_and_keeps_bytes():
    df = fd.dp_phase_frame(g.dp_step("r", 0) + g.dp_step("r", 1))
    assert set(df["step"]) == {1}
    d0 = df[df["device"] == "cpu:0"]
    assert list(d0["phase"]) == fd.DP_PHASES
    assert list(df[df["device"] == "cpu:1"]["phase"]) == fd.DP_PHASES[:-1]
    bc = d0[d0["phase"] == "broadcast"].iloc[0]
    assert (bc["start_ms"], bc["end_ms"], bc["dur_ms"], bc["nbytes"]) == pytest.approx(
        (0.0, 3.0, 3.0, 120000))


def test_comm_volume_frame_latest_step_in_mib():
    df = fsteps.comm_volume_frame(g.dp_step("r", 0, world_size=3) + g.dp_step("r", 1, world_size=3))
    assert df["device"].tolist() == ["cpu:0", "cpu:1", "cpu:2"]
    assert df["sent_mib"].tolist() == pytest.approx([240000 / 2**20, 120000 / 2**20,
                                                     120000 / 2**20])


def test_run_label_and_runs_frame():
    run = {"run_id": "abcdef123456", "label": None, "status": "succeeded",
           "config": {"mode": "ddp", "world_size": 2, "model": "mlp"},
           "summary": {"samples_per_s": 1234.5}, "created_at": g.T0}
    assert frames.run_label(run, run["run_id"]) == "ddp ×2 · abcdef"
    assert frames.run_label({**run, "label": "mine"}, "x") == "mine"
    single = {**run, "config": {"mode": "single", "world_size": 2}}  # a set's single run: one device
    assert frames.run_label(single, run["run_id"]) == "single ×1 · abcdef"
    assert fruns.runs_frame([single])["world_size"].tolist() == [1]
    older = {**run, "run_id": "old", "created_at": g.T0 - 10, "summary": None}
    df = fruns.runs_frame([older, run])
    assert df["run_id"].tolist() == ["abcdef123456", "old"]
    assert df["samples_per_s"].iloc[0] == 1234.5
    assert math.isnan(df["samples_per_s"].iloc[1])
    assert list(df.columns) == fruns.RUN_COLUMNS


def test_theory_star_ring_and_tree_bytes_and_shape_by_hand():
    from ddpviz.app.frames import topology as ftop

    P = 4 * 2**20  # 4 MiB of gradients
    nodes, edges = ftop.theory_star(8, P)
    assert len(nodes) == 8 and len(edges) == 7 and set(edges["mib"]) == {8.0}  # 2·P per link
    nodes, edges = ftop.theory_ring(8, P)
    assert len(edges) == 8 and set(edges["mib"]) == {2 * 7 / 8 * 4}  # 2(n−1)/n·P = 7 MiB
    nodes, edges = ftop.theory_tree(8, P)
    # heap order: 0 is the root; 1, 2 its children; 3..6 theirs; 7 under 3; every rank once
    assert sorted(edges["link"]) == sorted(["rank 0 ↔ rank 1", "rank 0 ↔ rank 2", "rank 1 ↔ rank 3",
                                           "rank 1 ↔ rank 4", "rank 2 ↔ rank 5", "rank 2 ↔ rank 6",
                                           "rank 3 ↔ rank 7"])
    assert set(edges["mib"]) == {4.0}  # half of P up and half down on one of the two trees
    ys = dict(zip(nodes["node"], nodes["y"]))
    assert ys["rank 0"] > ys["rank 1"] == ys["rank 2"] > ys["rank 3"] > ys["rank 7"]
    assert nodes[["x", "y"]].abs().max().max() <= 1.45  # inside the chart's square
    assert ftop.latency_steps(8) == {"ring": 14, "tree": 6, "star": 14}
    assert ftop.latency_steps(64)["tree"] == 12 and ftop.latency_steps(5)["tree"] == 6


def test_allreduce_time_frame_follows_the_two_models():
    from ddpviz.app.frames import topology as ftop

    from ddpviz.engine.predict.step_models import ALLREDUCE_MODELS

    f = ftop.allreduce_time_frame(1e6, 10e-6, 1e9, [2, 8], ALLREDUCE_MODELS)
    got = {(r.world_size, r.model): r.time_ms for r in f.itertuples()}
    assert got[(8, "ring")] == pytest.approx(1e3 * (14 * 10e-6 + 1.75e-3))
    assert got[(8, "tree")] == pytest.approx(1e3 * (6 * 10e-6 + 1.75e-3))
    assert got[(2, "ring")] == pytest.approx(got[(2, "tree")])  # one level: the two agree at n = 2


def test_allreduce_time_chart_names_its_axes_legend_and_theory():
    from ddpviz.app.charts.topology import allreduce_time_chart
    from ddpviz.app.frames import topology as ftop
    from ddpviz.engine.predict.step_models import ALLREDUCE_MODELS

    f = ftop.allreduce_time_frame(1e6, 10e-6, 1e9, [2, 4, 8], ALLREDUCE_MODELS)
    spec = allreduce_time_chart(f, subtitle="α, β fitted on the probe", mark_n=8).to_dict()
    enc = spec["layer"][0]["encoding"]
    assert "theory" in spec["title"]["text"] and enc["y"]["title"] == "one all-reduce of P (ms, theory)"
    assert enc["x"]["title"] == "world size n (ranks)" and enc["color"]["legend"]["title"] == "all-reduce model"
    assert sorted(set(f["model"])) == ["ring", "tree"]


def test_runs_whose_accuracy_agrees_at_every_evaluation_are_named_and_others_are_not():
    """By hand: DP and DDP 0.5 then 0.8 at steps 10 and 20 coincide; a third run 0.8 at step 20 but
    0.4 at 10 does not; one run alone never 'coincides'."""
    import pandas as pd

    from ddpviz.app.frames.steps import coinciding_runs

    def rows(run, accs):
        return [{"run": run, "step": s, "val_accuracy": a, "val_loss": 1.0} for s, a in accs]
    both = pd.DataFrame(rows("DP", [(10, 0.5), (20, 0.8)]) + rows("DDP", [(10, 0.5), (20, 0.8)]))
    assert coinciding_runs(both) == ["DP", "DDP"]
    other = pd.DataFrame(rows("DP", [(10, 0.5), (20, 0.8)]) + rows("X", [(10, 0.4), (20, 0.8)]))
    assert coinciding_runs(other) == []
    assert coinciding_runs(pd.DataFrame(rows("DP", [(10, 0.5)]))) == []


def test_a_cuda_no_hook_step_says_its_host_launches_are_not_drawn_instead_of_hover():
    """The CUDA no-hook path gives host launch times only: no mark is drawn, so the subtitle must not
    tell the reader to hover a bucket; it says why nothing is drawn."""
    from ddpviz.app.charts.buckets import bucket_timeline
    from ddpviz.engine.modes.ddp.reducer import ENQUEUE_SOURCE

    evs = [dict(type="bucket", run_id="r", step=4, rank=0, bucket_index=i, nbytes=1000, num_params=1, ready_s=None,
                comm_start_s=None, comm_end_s=None, enqueue_s=0.001 * (i + 1), source=ENQUEUE_SOURCE)
           for i in range(2)]
    buckets = fb.bucket_frame(evs).assign(lane="rank 0")
    backward = pd.DataFrame([{"rank": 0, "start_ms": 0.0, "end_ms": 5.0, "lane": "rank 0"}])
    exposed = pd.DataFrame(columns=["rank", "start_ms", "end_ms", "exposed_ms", "reported_ms", "lane"])
    spec = bucket_timeline(buckets, backward, exposed, run="r").to_dict()
    words = " ".join(spec["title"]["subtitle"])
    assert "hover a bucket" not in words and "host launch times are on the host's clock" in words


def test_the_learn_pages_link_words_say_fitted_and_where_it_is_extrapolated():
    """α and β are a fit to the probe's times over 4-64 MiB, never "measured"; P = 0.19 MiB lies below:
    extrapolated. P = 8 MiB lies inside: nothing said of extrapolation."""
    from ddpviz.app.views.learn import fitted_link_words

    fit = dict(alpha_s=928.9e-6, beta_bytes_per_s=1.604e9, points_used=[4 << 20, 64 << 20])
    words = fitted_link_words(fit, 0.19 * 2**20)
    assert "fitted, not measured" in words and "(measured)" not in words and "at 4.00 MiB–64.0 MiB" in words
    assert "P = 195 KiB lies outside those sizes: extrapolated" in words and "α = 929 µs" in words
    assert "extrapolated" not in fitted_link_words(fit, 8 << 20) and "same time" not in words
    assert "ring and tree take the same time" in fitted_link_words({**fit, "alpha_s": 0.0}, 8 << 20)
    # a fit that names no sizes: nothing said of where it holds
    assert "extrapolated" not in fitted_link_words({**fit, "points_used": []}, 0.19 * 2**20)


def test_a_runs_table_selection_follows_its_runs_when_rows_move():
    # worked by hand: "c" and "a" ticked (rows 2 and 0); a re-run "n" lands on top and "b" is deleted
    before = ["a", "b", "c", "d"]
    now = ["n", "a", "c", "d"]
    assert fruns.remap_selection(before, [0, 2], now) == [1, 2]
    assert fruns.remap_selection(before, [1], now) == []  # a deleted run is no longer selected
    assert fruns.remap_selection(before, [3, 7], ["d"]) == [0]  # a stale position beyond the table drops out
