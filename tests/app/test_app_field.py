"""Cases from the field (issue 12), app side: the failed-run panel names the stage, a plugin's own
dataset, labelled pairs and trios, validation accuracy on Live, the whole run on a long run's
chart with legends uncut, a row per bucket on Live, charts whose spec survives a refresh, the
metadata of a run whose stream was trimmed, and the Runs table's dash and reason."""

from __future__ import annotations

import json

import eventgen as g
import pytest

from ddpviz.app.charts import live as charts_live
from ddpviz.app.frames import steps as fsteps
from ddpviz.app.step_history import StepHistory, step_rates
from ddpviz.app.window import RunWindow


def specs(at) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("vega_lite_chart")]


def element(at, text: str):
    """The chart element whose title is `text`."""
    for c in at.get("vega_lite_chart"):
        if (json.loads(c.proto.spec).get("title") or {}).get("text") == text:
            return c
    raise AssertionError(f"no chart titled {text!r}")


def titled(at, text: str) -> dict:
    return json.loads(element(at, text).proto.spec)


def rows(at, text: str, layer: dict) -> list[dict]:
    """The rows a layer of the chart titled `text` draws (Streamlit sends them as Arrow)."""
    import pyarrow as pa

    proto = element(at, text).proto
    for d in proto.datasets:
        if d.name == layer["data"]["name"]:
            return pa.ipc.open_stream(d.data.data).read_all().to_pandas().to_dict("records")
    raise AssertionError("dataset not found")


def captions(at) -> str:
    return "\n".join(c.value for c in at.caption)


# -- 3: the stage -------------------------------------------------------------------------------

def test_the_failed_run_panel_names_the_stage_and_keeps_the_traceback(fake_client, app_test):
    err = {"stage": "plugin build", "rank": None, "step": None,
           "exception": "RuntimeError: plugin build exploded", "traceback": "Traceback ...\n  _boom"}
    fake_client.add_run("bad", {"mode": "ddp"}, status="failed", error=err,
                        events=[g.run_finished("bad", 0, "failed", err)])
    at = app_test("views/live.py", runs="bad")
    assert "Run failed (plugin build): RuntimeError: plugin build exploded" in at.error[0].value
    assert at.code[0].value == err["traceback"]
    err2 = {"stage": "training", "rank": 1, "step": 2, "exception": "InjectedFault: boom", "traceback": "tb"}
    fake_client.add_run("bad2", {"mode": "ddp"}, status="failed", error=err2, events=[])
    at = app_test("views/live.py", runs="bad2")
    assert "Run failed (rank 1 at step 2): InjectedFault: boom" in at.error[0].value
    assert at.expander[0].label == "Traceback (rank 1)" and at.code[0].value == "tb"


def test_a_refusal_before_training_shows_its_message_without_ddpvizs_traceback(fake_client, app_test):
    err = {"stage": "pre-flight", "rank": None, "step": None, "traceback": "Traceback ...\n  check_model_fits",
           "exception": "PreflightError: width: the mlp model has 3.16 B parameters ... lower width or depth"}
    fake_client.add_run("big", {"mode": "ddp"}, status="failed", error=err, events=[g.run_finished("big", 0, "failed", err)])
    at = app_test("views/live.py", runs="big")
    assert "Run failed (pre-flight): PreflightError: width:" in at.error[0].value
    assert not [c for c in at.code if "check_model_fits" in c.value]


# -- 12: the plugin's dataset; labels of pairs and trios ------------------------------------------

def test_a_plugin_run_is_labelled_with_the_plugins_own_dataset(fake_client, app_test):
    started = {**g.run_started("p1", "single", 1, 4), "dataset_name": "letters27"}
    fake_client.add_run("p1", {"mode": "single", "world_size": 1, "steps": 4}, status="succeeded",
                        events=[started, g.run_finished("p1", 0)])
    at = app_test("views/live.py", runs="p1")
    assert "mlp on letters27" in captions(at) and "on digits" not in captions(at)


def test_the_launch_forms_label_names_the_pair_and_the_trio(real_client, app_test):
    at = app_test()
    at.text_input(key="cfg_label").set_value("X")
    at.button(key="launch_pair").click().run()
    assert not at.exception
    labels = [real_client.get_run(r)["label"] for r in at.session_state["launched"]]
    assert labels == ["X · DP", "X · DDP"]
    at.segmented_control(key="launch_what").set_value("trio").run()
    at.button(key="launch_trio").click().run()
    labels = [real_client.get_run(r)["label"] for r in at.session_state["launched"]]
    assert labels == ["X · single", "X · DP", "X · DDP", "X · FSDP"]


# -- 18 (the Live part): validation accuracy -------------------------------------------------------

def test_live_shows_validation_accuracy(fake_client, app_test):
    events = g.full_run("a1", "ddp", steps=4)
    evals = [{"type": "eval", "run_id": "a1", "ts": g.T0 + 1, "rank": 0, "step": s, "val_loss": 1.5 - 0.2 * s,
              "val_accuracy": 0.5 + 0.1 * s} for s in (1, 3)]
    fake_client.add_run("a1", {"mode": "ddp", "steps": 4}, status="succeeded",
                        events=events[:-1] + evals + events[-1:])
    at = app_test("views/live.py", runs="a1")
    assert not at.exception
    spec = titled(at, "Validation accuracy")
    assert spec["encoding"]["y"]["field"] == "val_accuracy"
    assert [r["val_accuracy"] for r in rows(at, "Validation accuracy", spec)] == [0.6, 0.8]
    assert "validation accuracy **0.800**" in captions(at)  # the latest eval, step 3


@pytest.mark.parametrize("dp_acc, said", [(0.5, True), (0.45, False)])
def test_live_says_when_two_runs_accuracy_lines_lie_on_one_another(fake_client, app_test, dp_acc, said):
    """DP and DDP with the same accuracy at every evaluation draw one visible line: Live says why
    (a fresh-user review took DP for missing); with any evaluation apart, nothing is said."""
    for rid, mode, first in (("d", "ddp", 0.5), ("p", "dp", dp_acc)):
        events = g.full_run(rid, mode, steps=4)
        evals = [{"type": "eval", "run_id": rid, "ts": g.T0 + 1, "rank": 0, "step": s, "val_loss": 1.0,
                  "val_accuracy": first if s == 1 else 0.8} for s in (1, 3)]
        fake_client.add_run(rid, {"mode": mode, "steps": 4}, status="succeeded",
                            events=events[:-1] + evals + events[-1:])
    at = app_test("views/live.py", runs="d,p")
    assert not at.exception
    assert ("the same validation accuracy at every evaluation" in captions(at)) is said


# -- 9: the whole run, downsampled, and legends not cut -------------------------------------------

def long_run(n_steps: int) -> list[dict]:
    """A DDP run of `n_steps` steps whose samples/s is 1000 + step (so each bin's mean is known)."""
    out = [g.run_started("long", "ddp", 2, n_steps)]
    for s in range(n_steps):
        for rank in range(2):
            out.append({"type": "step", "run_id": "long", "ts": g.T0 + s, "rank": rank, "step": s,
                        "samples": 64, "step_time_s": 64 / (1000 + s), "loss": 1.0,
                        "forward_s": 0.0, "backward_s": 0.0, "comm_exposed_s": 0.0, "optimizer_s": 0.0})
    return out


def test_a_long_run_keeps_every_step_in_bins_with_exact_means():
    w = RunWindow("long", max_steps=500)
    w.ingest(long_run(5000))
    recent = fsteps.steps_frame(w.of_type("step"), "r")
    assert recent["step"].min() == 4500 and len(recent) == 500  # the window, in detail
    bins = w.history.frame("r")
    assert bins["step_lo"].min() == 0 and bins["step_hi"].max() == 4499  # the rest, binned
    assert bins["steps"].sum() == 4500 and len(bins) <= 240
    width = int(bins["bin_steps"].iloc[0])
    first = bins.iloc[0]
    assert first["mean"] == 1000 + (width - 1) / 2  # mean of 1000+0 .. 1000+width-1
    assert (first["lo"], first["hi"]) == (1000, 1000 + width - 1)
    assert bins["step_hi"].max() < recent["step"].min()  # every step once: history, then window


def test_step_rates_take_the_mean_over_ranks():
    evs = [{"type": "step", "step": 0, "rank": 0, "samples": 64, "step_time_s": 0.02},
           {"type": "step", "step": 0, "rank": 1, "samples": 64, "step_time_s": 0.04}]
    assert step_rates(evs) == {0: pytest.approx(64 / 0.03)}  # (20 + 40) / 2 ms, as steps_frame
    h = StepHistory(max_bins=2)
    h.add({"type": "step", "step": s, "samples": 10, "step_time_s": 1.0} for s in range(5))
    assert h.bin_steps == 4 and list(h.frame("r")["steps"]) == [4, 1]


def test_the_long_run_chart_says_what_is_binned_and_never_cuts_a_legend(fake_client, app_test):
    label = "a rather long run label · DDP"
    fake_client.add_run("long", {"mode": "ddp", "steps": 5000}, status="succeeded", label=label,
                        events=long_run(5000) + [g.run_finished("long", 5000)])
    at = app_test("views/live.py", runs="long")
    assert not at.exception
    spec = titled(at, "Throughput per step")
    sub = " ".join(spec["title"]["subtitle"])
    assert "the newest steps (up to 500): a dot per step" in sub  # up to: a wide run's window holds fewer
    assert "steps before those: dashed = mean per bin" in sub
    dots, _, band, _ = spec["layer"]
    assert [r["step"] for r in rows(at, "Throughput per step", dots)] == list(range(4500, 5000))
    binned = rows(at, "Throughput per step", band)
    assert binned[0]["step_lo"] == 0 and sum(r["steps"] for r in binned) == 4500
    legends = [layer["encoding"]["color"]["legend"] for layer in spec["layer"]
               if "legend" in layer["encoding"].get("color", {})]
    assert legends and all(lg.get("labelLimit") == 0 for lg in legends)
    assert "Steps before those drawn one by one (the newest, up to 500) are drawn in bins of" in captions(at)


# -- 13a: zoom on the step axis, and a spec that does not change with the data -------------------

def normalized_specs(at) -> list[str]:
    """Each chart's spec as Streamlit's frontend keys it (`baseSpecKey` in ArrowVegaLiteChart):
    the spec sent, with every dataset name replaced by its position. Equal keys: the browser
    keeps the Vega view and only swaps its data, so zoom, selections and tooltips survive."""
    out = []
    for c in at.get("vega_lite_chart"):
        spec = c.proto.spec
        for i, d in enumerate(c.proto.datasets):
            spec = spec.replace(f'"{d.name}"', f'"dataset {i}"')
        out.append(spec)
    return out


def test_live_charts_keep_their_spec_when_new_steps_arrive_and_the_step_axis_zooms(fake_client, app_test):
    import time

    events = g.full_run("d", "ddp", steps=8)
    body = events[1:-1] + [{"type": "eval", "run_id": "d", "ts": g.T0 + 2, "rank": 0, "step": s,
                            "val_loss": 1.0, "val_accuracy": 0.5 + 0.05 * s} for s in (1, 5)]
    fake_client.add_run("d", {"mode": "ddp", "steps": 8}, status="started",
                        events=[events[0]] + [e for e in body if e["step"] < 4])
    fake_client.add_run("p", {"mode": "dp", "steps": 8}, status="started",
                        events=[e for e in g.full_run("p", "dp", steps=8)[:-1] if e.get("step", 0) < 4])
    at = app_test("views/live.py", runs="d,p")
    assert not at.exception
    before = normalized_specs(at)
    fake_client.streams["d"] += [e for e in body if e["step"] >= 4]
    fake_client.streams["p"] += [e for e in g.full_run("p", "dp", steps=8)[1:-1] if e["step"] >= 4]
    time.sleep(0.6)  # past panels.POLL_INTERVAL_S: the next run reads the new events
    at.run()
    assert "step 8 / 8" in str([p.proto.text for p in at.get("progress")])  # the data did change
    after = normalized_specs(at)
    assert len(before) == len(after) >= 8 and before == after
    for name in ("Throughput per step", "Validation accuracy"):
        chart = element(at, name)
        spec = json.loads(chart.proto.spec)
        params = {p["name"]: p for part in [spec, *spec.get("layer", [])] for p in part.get("params", [])}
        assert params[charts_live.ZOOM]["bind"] == "scales"
        # the wheel alone scrolls the page; shift + wheel zooms
        assert params[charts_live.ZOOM]["select"] == {"type": "interval", "encodings": ["x"],
                                                      "zoom": "wheel![event.shiftKey]"}
        # the app listens to the zoom: Streamlit then keeps it when the data changes
        assert charts_live.ZOOM in list(chart.proto.selection_mode)


def test_live_detail_charts_do_not_name_the_step_in_their_spec(fake_client, app_test):
    fake_client.add_run("d", {"mode": "ddp", "steps": 4}, status="succeeded", events=g.full_run("d", "ddp"))
    at = app_test("views/live.py", runs="d")
    for s in specs(at):
        assert "step 3" not in json.dumps({k: v for k, v in s.items() if k != "datasets"})


# -- 10: a row per bucket on Live --------------------------------------------------------------------

def test_live_draws_a_row_per_bucket_like_the_bucket_page(fake_client, app_test):
    fake_client.add_run("d", {"mode": "ddp", "steps": 4}, status="succeeded", events=g.full_run("d", "ddp"))
    at = app_test("views/live.py", runs="d")
    spec = titled(at, "Gradient buckets")
    comm = next(layer for layer in spec["layer"] if layer["encoding"].get("x", {}).get("field") == "comm_start_ms")
    assert (comm["encoding"]["y"]["field"], comm["encoding"]["y2"]["field"]) == ("y0", "y1")
    drawn = rows(at, "Gradient buckets", comm)  # 3 buckets on each of 2 ranks: 6 rows, none shared
    assert len(drawn) == 6 and len({r["y0"] for r in drawn}) == 6


# -- 11: the bucket layout captions say what the tables show -----------------------------------------

def test_bucket_layout_captions_count_the_buckets_and_name_the_order():
    from ddpviz.app.frames.buckets import layout_captions as captions_of

    two = {"initial": [{"bucket_index": 0}, {"bucket_index": 1}], "rebuilt": [{"bucket_index": 0}],
           "bucket_cap_bytes": 1024, "first_bucket_cap_bytes": 1024}
    first, second = captions_of(two)
    assert "2 buckets" in first and "one bucket" not in first and "never share a bucket" in first
    assert "each row lists its parameters in registration order" in first
    assert "reverse registration order" not in first
    assert "1 bucket " in second and "order gradients became ready" in second


# -- 14: a run whose stream lost run_started ---------------------------------------------------------

def test_a_window_takes_run_started_from_the_record_when_the_stream_lost_it(fake_client):
    started = {**g.run_started("t", "ddp"), "grad_bytes": 4242,
               "bucket_preview": {"initial": [], "rebuilt": [{"bucket_index": 0, "nbytes": 4242}]}}
    events = g.full_run("t", "ddp")[1:]  # the stream was trimmed: no run_started in it
    fake_client.add_run("t", {"mode": "ddp", "steps": 4}, status="succeeded", events=events, started=started)
    w = RunWindow("t")
    w.poll(fake_client)
    assert w.started["grad_bytes"] == 4242 and w.started["bucket_preview"]["rebuilt"][0]["nbytes"] == 4242


# -- 15: the Runs table's dash and reason ------------------------------------------------------------

def test_runs_without_samples_per_s_show_a_dash_and_why(fake_client, app_test):
    fake_client.add_run("c1", {"mode": "ddp"}, status="canceled", summary={"steps_done": 0},
                        error={"exception": "Canceled: the worker is shutting down"})
    fake_client.add_run("l1", {"mode": "ddp"}, status="lost")
    fake_client.add_run("f1", {"mode": "ddp"}, status="failed", summary={"steps_done": 3},
                        error={"stage": "training", "rank": 1, "step": 3, "exception": "x"})
    fake_client.add_run("ok", {"mode": "ddp"}, status="succeeded", summary={"samples_per_s": 1234.0})
    at = app_test("views/runs.py")
    assert not at.exception
    table = at.dataframe[0]
    assert table.proto.placeholder == "—"
    notes = dict(zip(table.value["run_id"], table.value["note"]))
    assert notes == {"c1": "canceled after no step: the worker is shutting down",
                     "l1": ("lost: its worker stopped sending heartbeats before its summary; Live shows its stored "
                            "steps"),
                     "f1": "failed (rank 1 at step 3) after 3 step(s)", "ok": ""}


def test_the_live_bucket_chart_keeps_its_lanes_while_a_steps_events_arrive(fake_client, app_test):
    """A rank's `step` event can trail its `bucket` events: the chart must not lose that rank's lane
    for a refresh (a new spec rebuilds the view, and a rebuilt view hides every tooltip on the page)."""
    import time

    events = g.full_run("d", "ddp", steps=5)
    late = next(e for e in events if e["type"] == "step" and e["step"] == 3 and e["rank"] == 0)
    fake_client.add_run("d", {"mode": "ddp", "steps": 5}, status="started",
                        events=[e for e in events[:-1] if e is not late and e.get("step", 0) < 4])
    at = app_test("views/live.py", runs="d")
    before = normalized_specs(at)[[json.loads(c.proto.spec)["title"]["text"] for c in at.get("vega_lite_chart")]
                                  .index("Gradient buckets")]
    fake_client.streams["d"] += [late] + [e for e in events[:-1] if e.get("step", 0) == 4]
    time.sleep(0.6)
    at.run()
    after = normalized_specs(at)[[json.loads(c.proto.spec)["title"]["text"] for c in at.get("vega_lite_chart")]
                                 .index("Gradient buckets")]
    assert before == after
