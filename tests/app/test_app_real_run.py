"""Frames and charts on event files recorded from real CPU runs of the engine.

Recorded with: mlp on digits, world_size 2, width 256, 12 steps, bucket_cap_mb 0.1 (so DDP
has 3 buckets), global batch 64; DP emulated on virtual CPU devices, DDP on gloo.
"""

import json
from pathlib import Path

import pandas as pd
import pytest

from ddpviz.app.charts import dp as charts_dp
from ddpviz.app.charts import memory as charts_memory
from ddpviz.app.charts import steps as charts
from ddpviz.app.frames import base as frames
from ddpviz.app.frames import buckets as fb
from ddpviz.app.frames import dp as fd
from ddpviz.app.frames import memory as fm
from ddpviz.app.frames import steps as fsteps

DATA = Path(__file__).parent / "data"


def _load(name: str) -> list[dict]:
    with open(DATA / name, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


@pytest.fixture(scope="module")
def dp():
    return _load("real_dp_mlp_ws2.jsonl")


@pytest.fixture(scope="module")
def ddp():
    return _load("real_ddp_mlp_ws2.jsonl")


def test_ddp_buckets_cover_every_gradient_byte(ddp):
    grad_bytes = frames.of_type(ddp, "run_started")[0]["grad_bytes"]
    buckets = fb.bucket_frame(ddp)
    assert int(buckets["step"].iloc[0]) == 11  # the last step
    per_rank = buckets.groupby("rank")["nbytes"].sum()
    assert per_rank.tolist() == [grad_bytes, grad_bytes]
    assert (buckets["comm_end_ms"] >= buckets["comm_start_ms"]).all()
    assert (buckets["comm_start_ms"] >= buckets["ready_ms"] - 1e-6).all()  # no all-reduce before ready


def test_ddp_steps_and_split_match_events(ddp):
    steps = fsteps.steps_frame(ddp, "ddp")
    assert steps["step"].tolist() == list(range(12))
    raw = [e for e in frames.of_type(ddp, "step") if e["step"] == 5]
    assert steps.loc[5, "step_time_ms"] == pytest.approx(sum(e["step_time_s"] for e in raw) / len(raw) * 1000)
    split = fsteps.split_frame(steps)
    total = split["ms"].sum()
    assert total == pytest.approx(steps[steps["step"] >= 1]["step_time_ms"].median(), rel=0.5)


def test_dp_phases_and_device0_hot_spot(dp):
    phases = fd.dp_phase_frame(dp)
    assert set(phases["device"]) == {"cpu:0", "cpu:1"}
    assert "optimizer" in set(phases[phases["device"] == "cpu:0"]["phase"])
    assert "optimizer" not in set(phases[phases["device"] == "cpu:1"]["phase"])
    peak = fm.memory_peak_frame(dp, "dp").groupby("device")["peak_mib"].max()
    assert peak["cpu:0"] > peak["cpu:1"]  # measured: device 0 keeps the master copy and gathers


def test_all_charts_build_from_real_runs(dp, ddp):
    steps = pd.concat([fsteps.steps_frame(dp, "dp"), fsteps.steps_frame(ddp, "ddp")])
    built = [charts.throughput_curves_chart(steps), charts.split_chart(fsteps.split_frame(steps)),
             *charts_memory.memory_curve_charts(fm.memory_curve_frame(dp, "dp"),
                                                fm.memory_phase_frame(dp, fm.latest_traced_step(dp)), "dp"),
             charts_dp.dp_phase_chart(fd.dp_phase_frame(dp)),
             charts.comm_volume_chart(fsteps.comm_volume_frame(dp))]
    for chart in built:
        spec = chart.to_dict()
        assert spec["title"]["text"]
