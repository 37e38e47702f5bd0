"""The Tune page in AppTest on a real `ddpviz tune` stored in a real Redis (tests/app/recorded.py
`play_tune`): the answer, the trials table, the ratio chart with its interval and legend, the
bucket timelines of a round's baseline beside its candidate, a round whose runs are gone, the
best setting with the line to paste, and the page before any tune was stored."""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path

import pyarrow as pa
import pytest
from recorded import play_tune

from ddpviz.app.frames.tune import MEASURED, PREDICTED

ROOT = Path(__file__).resolve().parents[2]
RATIO_TITLE = "Step time of each setting vs the baseline"


def _specs(at) -> dict[str, dict]:
    """Title -> spec of every chart drawn, each with its datasets' rows under ``datasets``
    (Streamlit sends them beside the spec, as Arrow)."""
    out = {}
    for c in at.get("vega_lite_chart"):
        spec = json.loads(c.proto.spec)
        spec["datasets"] = {d.name: pa.ipc.open_stream(io.BytesIO(d.data.data)).read_all().to_pylist()
                            for d in c.proto.datasets}
        text = spec["title"]["text"]
        out[text if isinstance(text, str) else " ".join(text)] = spec
    return out


def _subtitle(spec) -> str:
    sub = spec["title"].get("subtitle") or ""
    return " ".join(sub) if isinstance(sub, list) else sub


def _layer_data(spec, i) -> list[dict]:
    return spec["datasets"][spec["layer"][i]["data"]["name"]]


@pytest.fixture
def stored(real_client, tmp_path):
    return play_tune(real_client, tmp_path)


def test_the_tune_page_shows_the_stored_search(stored, app_test):
    at = app_test("views/tune.py")
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    assert at.info[0].value == f"**Answer:** {stored['answer']}."
    assert stored["answer"].startswith("none beat the baseline beyond noise")
    trial = stored["trials"][0]
    table = at.dataframe[0].value
    assert table.to_dict("records") == [{
        "setting": "bucket_cap_mb=0.005", "predicted ratio": trial["predicted_ratio"], "measured ratio": trial["ratio"],
        "90% interval": f"{trial['interval'][0]:.3f}–{trial['interval'][1]:.3f}", "verdict": "slower",
        "loss diff": 0.0, "check": "same math", "rejected": False}]
    assert trial["note"].startswith("same math: ")  # the whole note under the table, which it does not fit
    assert f"bucket_cap_mb=0.005: {trial['note']}" in [c.value for c in at.caption]
    specs = _specs(at)
    base, cand = [t for t in specs if t != RATIO_TITLE]
    assert list(specs)[0] == RATIO_TITLE and base.startswith("baseline · round 1: step ")
    assert cand.startswith("bucket_cap_mb=0.005 · round 1: step ") and cand.split()[-1] == base.split()[-1]
    # the same step of the two runs the round's ratio came from: one bucket beside two
    assert _subtitle(specs[base]).startswith("1 bucket(s) per rank") and _subtitle(specs[cand]).startswith("2 bucket(s)")
    ratio = specs[RATIO_TITLE]
    assert "1.0" in _subtitle(ratio) and "faster" in _subtitle(ratio)
    colour = ratio["layer"][1]["encoding"]["color"]
    assert colour["scale"]["domain"] == [MEASURED, PREDICTED]
    assert MEASURED == "measured (median of rounds, 90% bootstrap interval)"
    assert ratio["layer"][1]["encoding"]["x"]["title"].endswith("(1.0 = baseline)")
    bar = _layer_data(ratio, 0)[0]
    assert (bar["lo"], bar["hi"]) == tuple(trial["interval"])
    assert {(p["series"], p["ratio"]) for p in _layer_data(ratio, 1)} == {
        (MEASURED, trial["ratio"]), (PREDICTED, trial["predicted_ratio"])}
    assert [r["ratio"] for r in _layer_data(ratio, 2)] == [1.0]


def test_a_round_whose_runs_are_gone_says_so(stored, app_test):
    at = app_test("views/tune.py")
    at.segmented_control(key=f"tune_round_{stored['tune_id']}_0").set_value(1).run()
    assert not at.exception
    gone = [r["run_id"] for r in stored["baseline"]["runs"] + stored["trials"][0]["runs"] if r["round"] == 1]
    assert at.warning[0].value.startswith(f"Run(s) {', '.join(gone)} are no longer stored")
    assert list(_specs(at)) == [RATIO_TITLE]


def test_a_winning_setting_shows_its_gain_interval_and_the_line_to_paste(stored, real_client, app_test):
    """The recorded search found no winner; the same runs read the other way round (each round's
    candidate as the baseline) make one, judged by tune's own functions."""
    from ddpviz.engine.tune import answer_line, compare, pick_best
    from ddpviz.workers.tunes import save_tune

    rep = copy.deepcopy(stored)
    trial = rep["trials"][0]
    trial.update(compare([(r["step_time_s"], r["baseline_step_time_s"]) for r in trial["runs"]]))
    assert trial["verdict"] == "faster"
    rep["best"] = pick_best(rep["trials"])
    rep["answer"] = answer_line(rep["best"])
    rep["tune_id"] = "winner0000"
    save_tune(real_client.redis, rep)
    at = app_test("views/tune.py")
    assert not at.exception
    assert at.selectbox(key="tune_pick").value == "winner0000"  # the newest first
    assert at.success[0].value == f"**Answer:** {rep['answer']}."
    lo, hi = rep["best"]["interval"]
    best = next(m.value for m in at.markdown if m.value.startswith("**Best setting:**"))
    assert f"`bucket_cap_mb=0.005` — step time ×{rep['best']['ratio']:.3f}" in best
    assert f"**{rep['best']['gain']:.1%} faster** (90% interval {lo:.3f}–{hi:.3f}" in best
    assert at.code[0].value == "DistributedDataParallel(model, ..., bucket_cap_mb=0.005)"
    assert at.dataframe[0].value["verdict"].tolist() == ["faster"]


def test_without_a_stored_tune_the_page_says_how_to_make_one(real_client, app_test):
    at = app_test("views/tune.py")
    assert not at.exception
    assert at.info[0].value.startswith("No tune stored yet.")
    assert at.code[0].value == "ddpviz tune -- torchrun --nproc-per-node 2 examples/attach/train_one_bucket.py"
    assert (ROOT / at.code[0].value.split()[-1]).is_file()
    assert not at.get("vega_lite_chart")
