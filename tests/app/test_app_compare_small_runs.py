"""Compare's peak-memory and bytes charts for attached and one-rank runs (issue 33.4): an axis in a
unit that suits the values (never "0.000000" over a [0, 0] domain), every bar labelled with its
bytes, titles whole; and the page draws both for the recorded attached run."""

from __future__ import annotations

import json

import pandas as pd
from recorded import play_attached

from ddpviz.app.charts.compare import bytes_chart, peak_memory_chart

MIB = 1024 * 1024


def _layers(chart) -> tuple[dict, dict, list[dict]]:
    spec = chart.to_dict()
    bars, text = spec["layer"]
    return bars, text, spec["datasets"][spec["data"]["name"] if "data" in spec else bars["data"]["name"]]


def test_one_rank_moves_nothing_and_the_chart_says_0_b_on_a_sound_axis():
    vol = pd.DataFrame({"run": ["ddp ×1"] * 2, "device": ["rank 0"] * 2,
                        "which": ["derived (ring all-reduce)", "theory"], "mib": [0.0, 0.0]})
    bars, text, rows = _layers(bytes_chart(vol))
    assert bars["encoding"]["x"]["scale"]["domain"] == [0, 1.0]  # not [0, 0]: no "0.000000" ticks
    assert bars["encoding"]["x"]["title"] == "sent + received per step (B)"
    assert text["mark"]["type"] == "text" and text["encoding"]["text"]["field"] == "label"
    assert [r["label"] for r in rows] == ["0 B", "0 B"]  # every bar labelled


def test_a_small_attached_model_reads_in_kib_every_bar_labelled():
    peaks = pd.DataFrame({"run": ["attached"] * 2, "device": ["rank 0", "rank 1"],
                          "peak_mib": [20_480 / MIB, 30_720 / MIB]})
    bars, text, rows = _layers(peak_memory_chart(peaks, {"attached": "ddp"}))
    assert bars["encoding"]["x"]["title"] == "measured peak (KiB)"
    assert [r["amount"] for r in rows] == [20.0, 30.0] and [r["label"] for r in rows] == ["20.0 KiB", "30.0 KiB"]
    assert bars["encoding"]["x"]["scale"]["domain"][0] == 0


def test_compare_draws_both_for_the_attached_run(real_client, app_test):
    play_attached(real_client)
    at = app_test("views/compare.py")
    assert not at.exception, [e.value for e in at.exception]
    specs = [json.loads(c.proto.spec) for c in at.get("vega_lite_chart")]
    titles = [str(s.get("title", {}).get("text")) for s in specs]
    assert "Peak memory per device" in titles and "Bytes moved per device per step" in titles, titles
    for s in specs:
        if str(s.get("title", {}).get("text")) in ("Peak memory per device", "Bytes moved per device per step"):
            assert [layer["mark"]["type"] for layer in s["layer"]][-1] == "text"  # labelled bars
