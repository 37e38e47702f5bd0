"""The Live page of an attached run (`ddpviz run -- torchrun SCRIPT`), on a recorded real one
(tests/app/data, recorded.ATTACHED): what it trained says the script, not "on None"; the place of
the accuracy chart shows the script's own loss and says there is no validation; sizes read in
the unit that suits them (`engine.analysis.format_bytes`); the step split leaves its plot room.
And a run opened after it ran (head and tail read, the middle not) says which steps it skipped."""

from __future__ import annotations

import json

import pytest
from recorded import ATTACHED, DATA, play_attached


def _events() -> list[dict]:
    with open(DATA / ATTACHED, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


@pytest.fixture
def live(real_client, app_test):
    rid = play_attached(real_client)
    at = app_test("views/live.py", runs=rid)
    assert not at.exception, [e.value for e in at.exception]
    return rid, at, " ".join(c.value for c in at.caption)


def test_the_config_line_names_the_script_not_a_dataset(live):
    rid, at, captions = live
    started = next(e for e in _events() if e["type"] == "run_started")
    assert started["script"] == "train_regression.py" and started["config"]["dataset"] is None
    assert f"{started['config']['model']} from train_regression.py · global batch 128" in captions
    assert "on None" not in captions


def test_no_endless_wait_for_an_evaluation_the_loss_is_the_scripts(live):
    rid, at, captions = live
    assert not any("first evaluation" in i.value for i in at.info)
    assert captions.count("the script's own training loss") == 1 and "no validation" in captions
    charts = [json.loads(c.proto.spec) for c in at.get("vega_lite_chart")]
    loss = [c for c in charts if "Training loss" in str(c.get("title"))]
    assert len(loss) == 1 and loss[0]["encoding"]["y"]["field"] == "loss"


def _unit_text(nbytes: float) -> str:
    """Independent of the helper: the largest binary unit not above nbytes, 3 significant figures."""
    for name, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= size:
            v = nbytes / size
            return f"{v:.0f} {name}" if v >= 100 else f"{v:.1f} {name}" if v >= 10 else f"{v:.2f} {name}"
    return f"{nbytes:.0f} B"


def test_sizes_read_in_the_unit_that_suits_them(live):
    rid, at, captions = live
    events = _events()
    buckets = [e for e in events if e["type"] == "bucket"]
    last = max(e["step"] for e in buckets)
    grads = sum(e["nbytes"] for e in buckets if e["step"] == last and e["rank"] == 0)  # 560 KiB: not "0.53 MiB"
    assert f"bucket(s), {_unit_text(grads)} of gradients per rank" in captions
    assert "0.00 MiB" not in captions and "0.000 GB/s" not in captions


def test_a_comm_hooks_compressed_bytes_are_not_called_the_gradients(real_client, app_test):
    """With fp16 compression (the recording made as a hook would have: each bucket all-reduces half its bytes,
    `uncompressed_nbytes` its own), the caption gives the gradients' size and the bytes sent apart. Before
    2026-12-06 a PowerSGD run's 41 KiB of gradients read "2.39 KiB of gradients per rank"."""
    def fp16(e):
        if e["type"] == "bucket":
            e["uncompressed_nbytes"], e["nbytes"] = e["nbytes"], e["nbytes"] // 2
        if e["type"] == "run_started":
            e["config"] = {**e["config"], "comm_hook": "fp16_compress_hook"}

    rid = play_attached(real_client, run_id="attached0fp16", edit=fp16)
    at = app_test("views/live.py", runs=rid)
    assert not at.exception, [e.value for e in at.exception]
    captions = " ".join(c.value for c in at.caption)
    buckets = [e for e in _events() if e["type"] == "bucket"]
    last = max(e["step"] for e in buckets)
    grads = sum(e["nbytes"] for e in buckets if e["step"] == last and e["rank"] == 0)
    assert f"bucket(s), {_unit_text(grads)} of gradients per rank ({_unit_text(grads // 2)} all-reduced: the " \
           "tensors fp16_compress_hook handed over)" in captions
    assert "This run's fp16_compress_hook all-reduces its own, compressed tensors" in captions  # bytes vs theory


def test_a_step_of_several_synced_backwards_says_its_buckets_are_the_last_ones(real_client, app_test):
    """A script accumulating over 3 micro-batches without no_sync(): DDP all-reduces in each backward, the step's
    bucket events are its last backward's (a new user found 2 of 3 hidden, unsaid, 2026-12-06)."""
    def three(e):
        if e["type"] == "step":
            e["micro_steps"], e["no_sync_micro_steps"] = 3, 0

    rid = play_attached(real_client, run_id="attached0three", edit=three)
    at = app_test("views/live.py", runs=rid)
    assert not at.exception, [e.value for e in at.exception]
    captions = " ".join(c.value for c in at.caption)
    assert "the last of its 3 backwards that all-reduced" in captions
    rid = play_attached(real_client, run_id="attached0nosync", edit=lambda e: e.update(
        micro_steps=3, no_sync_micro_steps=2) if e["type"] == "step" else None)  # no_sync() on the first two
    captions = " ".join(c.value for c in app_test("views/live.py", runs=rid).caption)
    assert "backwards that all-reduced" not in captions


def test_a_run_whose_samples_were_not_seen_reads_not_measured_not_zero(real_client, app_test):
    """An attached script without DDP, DP or FSDP: its steps' samples are null (engine.attach.steps
    SAMPLES_NOT_SEEN). Before 2026-12-06 Live read "median samples/s 0" and, the run over, "model not known yet"."""
    def unseen(e):
        if e["type"] == "step":
            e["samples"] = e["samples_per_s"] = None
        if e["type"] == "run_started":
            e["config"] = {**e["config"], "global_batch_size": None, "model": None, "mode": "single"}
        if e["type"] == "run_finished":
            e["summary"] = {**e["summary"], "samples_per_s": None}

    rid = play_attached(real_client, run_id="attached0unseen", edit=unseen)
    at = app_test("views/live.py", runs=rid)
    assert not at.exception, [e.value for e in at.exception]
    tiles = {m.label: m.value for m in at.metric}
    assert [v for k, v in tiles.items() if k.endswith("median samples/s")] == ["not measured"]
    captions = " ".join(c.value for c in at.caption)
    assert "no DDP, DP or FSDP module seen" in captions and "global batch" not in captions


@pytest.mark.parametrize("status", ["succeeded", "failed", "canceled"])
def test_an_attached_run_cut_short_reads_its_steps_not_n_of_n(real_client, app_test, status):
    """A script that failed or was stopped stores the steps it did as its `steps`: the new user's rank that
    raised read "failed · step 11 / 11" (2026-12-06). Only a script that ended by itself reads "n / n"."""
    from ddpviz.workers.store import RunStatus

    rid = play_attached(real_client, run_id=f"attached0{status}", status=RunStatus(status))
    at = app_test("views/live.py", runs=rid)
    assert not at.exception, [e.value for e in at.exception]
    n = next(e for e in _events() if e["type"] == "run_finished")["summary"]["steps_done"]
    bars = [p.proto.text for p in at.get("progress")]
    captions = " ".join(c.value for c in at.caption)
    if status == "succeeded":
        assert bars == [f"step {n} / {n}"]
    else:
        assert bars == [] and f"step {n} · attached: " in captions


def test_a_command_that_failed_before_any_rank_started_says_so_not_single_device(real_client, app_test):
    """`ddpviz run -- torchrun --nproc-per-node 2 train_regresion.py` (misspelt): the record has a command and no
    event. Live read "single device: no communication to show" and the attached-loss note (a new user, 2026-12-06)."""
    from ddpviz.app.panels import ATTACHED_LOSS_NOTE
    from ddpviz.workers.attached import create_record
    from ddpviz.workers.store import RunStatus, make_error

    rid = "attached0missing"
    create_record(real_client.store, rid, ["torchrun", "--nproc-per-node", "2", "train_regresion.py"], None)
    real_client.store.finish(rid, RunStatus.FAILED, error=make_error("CommandFailed: no such script", None))
    at = app_test("views/live.py", runs=rid)
    assert not at.exception, [e.value for e in at.exception]
    captions = " ".join(c.value for c in at.caption)
    assert "single device" not in captions and ATTACHED_LOSS_NOTE not in captions
    assert "ended (failed) before the first rank's start came" in captions


@pytest.mark.parametrize("nbytes,text", [(0, "0 B"), (84, "84 B"), (1023, "1023 B"), (1024, "1.00 KiB"),
                                         (561156, "548 KiB"), (25 * 2**20, "25.0 MiB"),
                                         (1.2 * 2**30, "1.20 GiB")])
def test_format_bytes(nbytes, text):
    from ddpviz.engine.analysis import format_bytes

    assert format_bytes(nbytes) == text


def test_format_rate_and_the_bytes_axis():
    import pandas as pd

    from ddpviz.app.charts.steps import comm_volume_chart
    from ddpviz.engine.analysis import format_rate

    assert [format_rate(r) for r in (420e3, 3.5e7, 1.9e9)] == ["420 kB/s", "35.0 MB/s", "1.90 GB/s"]
    tiny = pd.DataFrame({"device": ["cpu:0"], "sent_mib": [84 / 2**20], "recv_mib": [84 / 2**20],
                         "theory_sent_mib": [84 / 2**20], "theory_recv_mib": [84 / 2**20],
                         "source": ["derived (ring all-reduce)"]})  # Linear(20, 1): 84 B of gradients
    spec = comm_volume_chart(tiny).to_dict()
    assert spec["encoding"]["x"]["title"] == "sent + received per step (B)"
    assert {r["amount"] for r in list(spec["datasets"].values())[0]} == {168.0}


def test_the_step_split_keeps_long_run_names_off_its_y_axis(live):
    rid, at, captions = live
    charts = [json.loads(c.proto.spec) for c in at.get("vega_lite_chart")]
    split = next(c for c in charts if "Step time split" in str(c.get("title")))
    bars, names = split["layer"]
    assert bars["encoding"]["y"]["axis"]["labels"] is False  # the name is written above the bar instead
    assert names["mark"]["type"] == "text" and names["encoding"]["text"]["field"] == "run"
    assert bars["encoding"]["color"]["legend"]["orient"] == "bottom"


def test_a_run_opened_late_reads_the_middle_it_skipped_on_the_next_polls(real_client, redis_client):
    """A finished run longer than a window's head + tail: the first poll reads only those
    (`RunWindow._open`) and says which steps it skipped, and the throughput chart's dashed line
    breaks there instead of drawing across them; the next polls read the middle, so every step
    of the run ends up drawn once, with its samples/s as the events give it."""
    import eventgen as g

    from ddpviz.app.charts.live import live_throughput_chart
    from ddpviz.app.panels import _segmented
    from ddpviz.app.step_history import step_rates
    from ddpviz.app.window import RunWindow
    from ddpviz.workers.sink import RedisStreamWriter
    from ddpviz.workers.store import RunStatus

    n = 1600
    rid = real_client.submit({"mode": "ddp", "world_size": 2, "steps": n})
    real_client.store.mark_started(rid, "test-worker")
    events = [g.run_started(rid, "ddp", steps=n)] + [e for s in range(n) for e in g.ddp_step(rid, s)]
    RedisStreamWriter(redis_client, rid).write_batch(events + [g.run_finished(rid, n)])
    real_client.store.finish(rid, RunStatus.SUCCEEDED, summary={})
    w = RunWindow(rid)
    w.poll(real_client)
    assert w.unread_steps is not None and not w.done
    lo, hi = w.unread_steps
    assert 0 < lo <= hi < n - w.max_steps
    binned = {s for b in w.history.bins.values() for s in range(b.first, b.last + 1)}
    assert not (binned | {e["step"] for e in w.of_type("step")}) & set(range(lo, hi + 1))
    earlier = _segmented(w.history.frame("r"), w.unread_steps)
    spec = live_throughput_chart(pd_frame(), earlier, ["r"], w.max_steps).to_dict()
    assert spec["layer"][3]["encoding"]["detail"]["field"] == "segment"
    rows = list(spec["datasets"].values())[-1]
    assert {r["segment"] for r in rows if r["step_hi"] < lo} == {0}
    assert {r["segment"] for r in rows if r["step_lo"] > hi} == {1}
    for _ in range(20):
        if w.done:
            break
        w.poll(real_client)
    assert w.done and w.unread_steps is None
    window = {e["step"] for e in w.of_type("step")}
    assert window == set(range(n - w.max_steps, n))
    # every earlier step folded once: the bins' counts and sums are those of the events' own rates
    rates = step_rates(e for e in events if e["type"] == "step" and e["step"] < n - w.max_steps)
    assert sum(b.count for b in w.history.bins.values()) == len(rates) == n - w.max_steps
    assert sum(b.total for b in w.history.bins.values()) == pytest.approx(sum(rates.values()))


def pd_frame():
    from ddpviz.app.frames.steps import steps_frame

    return steps_frame([], "r")


def test_a_finished_run_without_evaluations_does_not_wait_for_one(real_client, redis_client, app_test):
    import eventgen as g

    from ddpviz.workers.sink import RedisStreamWriter
    from ddpviz.workers.store import RunStatus

    rid = real_client.submit({"mode": "ddp", "world_size": 2, "steps": 4})
    real_client.store.mark_started(rid, "test-worker")
    events = [e for e in g.full_run(rid, "ddp") if e["type"] != "eval"]
    RedisStreamWriter(redis_client, rid).write_batch(events)
    real_client.store.finish(rid, RunStatus.SUCCEEDED, summary={})
    at = app_test("views/live.py", runs=rid)
    assert not at.exception, [e.value for e in at.exception]
    assert not any("first evaluation" in i.value for i in at.info)
    assert any("recorded no evaluation" in c.value for c in at.caption)
    assert not any("memory timer" in i.value for i in at.info)  # none will come either


def test_memory_within_a_step_of_a_tiny_model_is_drawn_in_bytes_not_fractions_of_a_mib():
    import pandas as pd

    from ddpviz.app.charts.memory import memory_curve_charts

    held_bytes = [0, 168, 420]  # Linear(20, 1): its weights, gradients and a few activations
    curve = pd.DataFrame({"t_ms": [0.0, 1.0, 2.0], "mib": [b / 2**20 for b in held_bytes], "device": "cpu:0",
                          "source": "tensors", "source_label": "tensors (live-tensor ledger)", "step": 3})
    spec = memory_curve_charts(curve, pd.DataFrame(columns=["phase", "start_ms", "end_ms"]), "r",
                               y_max_mib=420 / 2**20)[0].to_dict()
    y = spec["encoding"]["y"]
    assert y["title"] == "bytes held (B)" and y["scale"]["domain"] == [0, 500]
    assert [r[y["field"]] for r in list(spec["datasets"].values())[0]] == pytest.approx(held_bytes)


def test_an_attached_run_before_rank_0_started_names_its_command_without_nones():
    from ddpviz.app.panels import what_trained
    from ddpviz.app.window import RunWindow

    w = RunWindow("x")
    w.run = {"status": "started", "config": {"mode": "ddp", "attached": True, "command": ["torchrun", "t.py"]}}
    assert what_trained(w) == "attached to torchrun t.py, model not known yet"
    w.started = {"attached": True, "script": "t.py"}
    w.run["config"].update(model="Linear", dataset=None)
    assert what_trained(w) == "Linear from t.py"
