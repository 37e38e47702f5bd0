"""FSDP's frames and charts on a recorded real run, against references outside the code under test.

Recorded (tests/app/data/real_fsdp_mlp_ws2.jsonl): mlp 64 -> 256 x3 -> 10 on digits, mode fsdp,
world_size 2 on gloo, 12 steps, global batch 64, SGD — the recorded DP/DDP runs' config (its
sampled steps with collectives: 0, 1, 2, 10 and 11; traced memory: 0, 1, 2 and 11).
References: the run's `grad_bytes` (`engine.models.grad_bytes`, the model's parameter bytes; no
dim-0 padding at n = 2 since every row count is even), the layer sizes of the mlp worked by
hand, FSDP2's documented collectives.
"""

import json
from pathlib import Path

import pytest

from ddpviz.app.charts import fsdp as charts_fsdp
from ddpviz.app.charts.style import MAX_POINTS
from ddpviz.app.frames import base as frames
from ddpviz.app.frames import compare as fc
from ddpviz.app.frames import fsdp as ff
from ddpviz.app.window import RunWindow
from ddpviz.workers.sweeps import trio_configs

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def fsdp():
    with open(DATA / "real_fsdp_mlp_ws2.jsonl", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def test_collective_frame_covers_every_parameter_byte_each_way(fsdp):
    grad_bytes = frames.of_type(fsdp, "run_started")[0]["grad_bytes"]
    coll = ff.collective_frame(fsdp)
    assert int(coll["step"].iloc[0]) == 11 and set(coll["rank"]) == {0, 1}
    for _, r in coll.groupby("rank"):
        fwd = r[r["kind"] == "all-gather (forward)"]
        assert fwd["nbytes"].sum() == grad_bytes  # every unit gathered once before its forward
        assert r.loc[r["kind"] == "reduce-scatter", "nbytes"].sum() == grad_bytes
        assert set(r.loc[r["kind"] == "all-gather (backward)", "unit"]) == {"hidden.0", "hidden.1", "hidden.2"}
    assert (coll["end_ms"] >= coll["start_ms"]).all() and (coll["shard_nbytes"] * 2 == coll["nbytes"]).all()


def test_passes_hold_their_collectives(fsdp):
    coll = ff.collective_frame(fsdp)
    passes = ff.pass_frame(fsdp, 11)
    assert sorted(passes["phase"]) == ["backward", "backward", "forward", "forward"]
    for _, c in coll.iterrows():
        p = passes[(passes["rank"] == c["rank"]) & (passes["phase"] == c["phase"])].iloc[0]
        assert p["start_ms"] - 2 <= c["start_ms"] and c["end_ms"] <= p["end_ms"] + 2


HIDDEN_1_BYTES = (256 * 256 + 256) * 4  # hidden.1 of the recorded mlp, gathered whole: Linear(256, 256)


def test_memory_curve_frame_holds_half_the_model_at_rest_and_a_whole_unit_when_gathered(fsdp):
    """At n = 2 (no padding) each rank keeps half of every parameter between steps (SGD without
    momentum: no optimizer state); after backward half of every gradient; while a unit is gathered,
    all of it (ZeRO-3, FSDP2's docs)."""
    grad_bytes = frames.of_type(fsdp, "run_started")[0]["grad_bytes"]
    curve = ff.memory_curve_frame(fsdp, rank=1)
    assert int(curve["step"].iloc[0]) == 11 and set(curve["kind"]) == set(ff.MEMORY_KINDS)

    def at(label, kind):
        return curve.loc[(curve["label"] == label) & (curve["kind"] == kind), "mib"].iloc[0]

    assert at("optimizer end", "sharded_params") == pytest.approx(grad_bytes / 2 / frames.MIB)
    assert at("optimizer end", "optimizer_state") == 0 and at("optimizer end", "unsharded_params") == 0
    assert at("optimizer end", "sharded_grads") == 0  # zero_grad(set_to_none=True)
    assert at("backward end", "sharded_grads") == pytest.approx(grad_bytes / 2 / frames.MIB)
    assert at("unsharded hidden.1", "unsharded_params") >= HIDDEN_1_BYTES / frames.MIB


def test_shard_frame_draws_one_unit_three_ways(fsdp):
    shards = ff.shard_frame(fsdp)
    assert shards["unit"].iloc[0] in ("hidden.1", "hidden.2")  # the 256 x 256 layers are the largest
    assert len(shards) == 3 * 2 * 2
    own = shards[shards["holder"].str[-1] == shards["slice"].str[-1]]
    assert set(own.loc[own["picture"] != "reduce-scatter", "role"]) == {"own shard"}
    assert set(shards.loc[(shards["picture"] == "sharded") & ~shards.index.isin(own.index), "role"]) == {"not held"}
    gathered = ff.collective_frame(fsdp)
    shard_mib = gathered.loc[gathered["unit"] == shards["unit"].iloc[0], "shard_nbytes"].iloc[0] / frames.MIB
    assert shards["mib"].max() == pytest.approx(shard_mib)


def _check(spec: dict) -> None:
    assert spec["title"]["text"]
    rows = sum(len(v) for v in spec.get("datasets", {}).values())
    assert rows <= MAX_POINTS


def _rows(spec: dict, part: dict) -> list[dict]:
    return spec["datasets"][part["data"]["name"]]


def test_fsdp_charts_draw_the_runs_collectives_and_memory(fsdp):
    coll = ff.collective_frame(fsdp)
    timeline = charts_fsdp.unit_timeline_chart(coll, ff.pass_frame(fsdp, 11), "FSDP").to_dict()
    _check(timeline)
    assert timeline["title"]["text"] == "FSDP unit timeline: FSDP"
    assert timeline["layer"][0]["encoding"]["x"]["title"] == "ms from the step's forward start"
    bars = _rows(timeline, timeline["layer"][1])
    # FSDP2 (its docs): 4 units gathered in forward, the 3 non-root ones again in backward, 4 scattered
    assert len(bars) == 2 * (4 + 3 + 4)
    recorded = {(e["rank"], e["unit"], e["kind"], e["phase"], round(e["start_s"] * 1e3, 6), round(e["end_s"] * 1e3, 6))
                for e in frames.of_type(fsdp, "fsdp_collective") if e["step"] == 11}
    drawn = {(b["rank"], b["unit"], "reduce_scatter" if b["lane"] == "reduce-scatter" else "all_gather", b["phase"],
              round(b["start_ms"], 6), round(b["end_ms"], 6)) for b in bars}
    assert drawn == recorded  # every bar is a recorded collective, at its measured time
    grad_bytes = frames.of_type(fsdp, "run_started")[0]["grad_bytes"]
    curve = charts_fsdp.memory_curve_chart(ff.memory_curve_frame(fsdp)).to_dict()
    _check(curve)
    assert curve["encoding"]["y"]["title"] == "MiB held (tensors alive)"
    at_rest = sum(r["mib"] for r in _rows(curve, curve) if r["label"] == "optimizer end")
    assert at_rest == pytest.approx(grad_bytes / 2 / frames.MIB)  # the stack at rest: rank 0's half
    grid = charts_fsdp.shard_chart(ff.shard_frame(fsdp)).to_dict()
    _check(grid)
    assert [p["title"]["text"] for p in grid["hconcat"]] == ["sharded", "all-gather", "reduce-scatter"]


def test_compare_names_fsdp_ranks_and_uses_its_own_formula(fsdp):
    w = RunWindow("f", recent_steps=8, first_steps=2)
    w.ingest(fsdp)
    w.run = {"config": fsdp[0]["config"], "status": "succeeded", "summary": fsdp[-1]["summary"]}
    view = fc.view_of(w, "FSDP")
    vol = fc.bytes_frame([view])
    grad = fsdp[0]["grad_bytes"]
    theory = vol[vol["which"] == "theory"]
    assert set(theory["device"]) == {"rank 0", "rank 1"}
    # 3(n-1)/n * P each way, n = 2: 1.5 P sent + 1.5 P received
    assert theory["mib"].tolist() == pytest.approx([3 * grad / frames.MIB] * 2, rel=1e-6)
    row = fc.compare_frame([view]).iloc[0]
    assert row["mode"] == "fsdp" and row["peak_mib_max"] > 0
    # its bytes are labelled as FSDP derives them, not with DDP's ring all-reduce
    assert row["bytes_source"] == "derived (collective bytes x wire factor)"
    assert set(vol["which"]) == {"derived (collective bytes x wire factor)", "theory"}


def test_a_compare_set_gives_fsdp_fields_to_the_fsdp_run_only():
    items = trio_configs({"steps": 3, "reshard_after_forward": False, "fsdp_param_dtype": "bfloat16"})
    assert [c["mode"] for c, _ in items] == ["single", "dp", "ddp", "fsdp"]
    assert [label for _, label in items] == ["single", "DP", "DDP", "FSDP"]
    assert all("reshard_after_forward" not in c for c, _ in items[:3])
    assert items[3][0]["reshard_after_forward"] is False and items[3][0]["fsdp_param_dtype"] == "bfloat16"


def test_chrome_trace_carries_every_fsdp_collective(fsdp):
    from ddpviz.engine.export import chrome_trace

    spans = [e for e in chrome_trace(fsdp)["traceEvents"] if e.get("cat") == "fsdp"]
    assert len(spans) == len(frames.of_type(fsdp, "fsdp_collective"))
    assert {s["name"] for s in spans} >= {"all-gather root (forward)", "reduce-scatter hidden.0 (backward)"}
    assert all(s["dur"] >= 0 for s in spans)


def test_the_live_memory_chart_draws_fsdps_ledger_curve(fsdp):
    """FSDP's `memory` events carry the ledger's curve over the whole step, as DDP's: it starts
    at the half of the model each rank keeps (n = 2, SGD: no state) and rises by at least a whole
    gathered unit; its highest point is the reported peak."""
    from ddpviz.app.frames import memory as fm

    grad_bytes = frames.of_type(fsdp, "run_started")[0]["grad_bytes"]
    curve = fm.memory_curve_frame(fsdp, "FSDP")
    step = int(curve["step"].iloc[0])
    held = curve[curve["source"] == "tensors"]
    assert step == 11 and set(held["device"]) == {"cpu:0", "cpu:1"}
    for e in (e for e in fsdp if e["type"] == "memory" and e["step"] == step):
        mine = held[held["device"] == e["device"]].sort_values("t_ms")
        assert mine["mib"].iloc[0] == pytest.approx(grad_bytes / 2 / fm.MIB)
        assert mine["mib"].max() >= (grad_bytes / 2 + HIDDEN_1_BYTES) / fm.MIB
        assert mine["mib"].max() == pytest.approx(e["peak_allocated_bytes"] / fm.MIB)
    assert set(curve["source_label"]) == {"tensors (live-tensor ledger)", "process RSS (psutil)"}


def test_the_curve_caption_gives_the_measured_peak_beside_the_sampled_points(fsdp):
    curve = ff.memory_curve_frame(fsdp, rank=0)
    mem = [e for e in frames.of_type(fsdp, "memory") if e["step"] == 11 and e["rank"] == 0][0]
    text = ff.curve_caption(curve, frames.of_type(fsdp, "memory"))
    assert f"measured peak {mem['peak_allocated_bytes'] / frames.MIB:.2f} MiB (tensors (live-tensor ledger)" in text


def test_exposed_comm_not_measured_on_cuda_reads_as_text_everywhere(fsdp):
    """FSDP on CUDA writes `comm_exposed_s: null`, `comm_exposed_measured: false` (its step cannot
    see FSDP2's comm streams; tests/engine/test_fsdp_cuda_split.py). The summary, the Live split,
    Compare and `ddpviz compare` must say "not measured on CUDA", never show a number for it."""
    from ddpviz.app.frames import steps as fsteps
    from ddpviz.engine.harness.compare import mode_report
    from ddpviz.engine.result import RunResult
    from ddpviz.engine.summary import SummaryBuilder

    cuda = [{**e, "comm_exposed_s": None, "comm_exposed_measured": False} if e["type"] == "step" else e
            for e in fsdp if e["type"] != "run_finished"]
    b = SummaryBuilder()
    for e in cuda:
        b.observe(e)
    summary = b.summary()
    assert summary["comm_exposed_s"] is None and summary["comm_exposed_note"] == "not measured on CUDA"
    assert summary["overlap"] is None and summary["step_time_s"] > 0
    steps = fsteps.steps_frame(cuda, "FSDP")
    split = fsteps.split_frame(steps)
    assert "exposed comm" not in set(split["part"]) and set(split["part"]) >= {"forward", "backward"}
    assert fsteps.unmeasured_parts(steps) == {"FSDP": "exposed comm not measured on CUDA"}
    w = RunWindow("f", recent_steps=8, first_steps=2)
    w.ingest(cuda)
    w.run = {"config": cuda[0]["config"], "status": "succeeded", "summary": summary}
    table = fc.side_by_side(fc.compare_frame([fc.view_of(w, "FSDP")]))
    cell = table.loc[table["measure"] == "  exposed comm (ms)", "FSDP"].iloc[0]
    assert cell == "not measured on CUDA"
    report = mode_report(RunResult("succeeded", summary=summary), None)
    assert report["step_time_split"]["comm_exposed_s"] is None
    assert report["comm_exposed_note"] == "not measured on CUDA"


def test_compare_says_why_fsdp_overlaps_nothing_on_cpu(fsdp):
    """A real FSDP2 run on 2 gloo ranks: every collective blocked the training thread, so the summary's overlap is
    0 (the union of the collectives' spans is the exposed comm); Compare's cell says so beside the 0%, and the
    step's exposed comm stays a number."""
    from ddpviz.engine.summary import FSDP_HOST_BLOCKING, SummaryBuilder

    b = SummaryBuilder()
    for e in fsdp:
        b.observe(e)
    summary = b.summary()
    assert summary["overlap"] == 0 and summary["comm_exposed_s"] > 0
    w = RunWindow("f", recent_steps=8, first_steps=2)
    w.ingest([e for e in fsdp if e["type"] != "run_finished"])
    w.run = {"config": fsdp[0]["config"], "status": "succeeded", "summary": summary}
    table = fc.side_by_side(fc.compare_frame([fc.view_of(w, "FSDP")])).set_index("measure")
    assert table.loc["overlap (1 − exposed / total comm)", "FSDP"] == f"0% (by construction on CPU: {FSDP_HOST_BLOCKING})"
    assert table.loc["  exposed comm (ms)", "FSDP"] == f"{summary['comm_exposed_s'] * 1e3:.2f}"
