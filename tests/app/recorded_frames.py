"""What the analysis-frame tests share: the recorded real runs (tests/app/data, see test_app_real_run.py:
mlp on digits, world_size 2, width 256, 12 steps, bucket_cap_mb 0.1, 3 buckets after the rebuild) as event
lists and compare views, their fixtures, and the check every chart passes."""

import json
from pathlib import Path

import pytest

from ddpviz.app.charts.style import MAX_POINTS
from ddpviz.app.frames import compare as fc
from ddpviz.app.window import RunWindow

DATA = Path(__file__).parent / "data"
P = 603176  # gradient bytes of the recorded model (run_started.grad_bytes)


def load(name: str) -> list[dict]:
    with open(DATA / name, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def view(name: str, label: str) -> fc.RunView:
    events = load(name)
    w = RunWindow(label, recent_steps=8, first_steps=2)
    w.ingest(events)
    w.run = {"config": events[0]["config"], "status": "succeeded",
             "summary": events[-1]["summary"]}
    return fc.view_of(w, label)


@pytest.fixture(scope="module")
def trio():
    return [view("real_single_mlp_ws2.jsonl", "single"), view("real_dp_mlp_ws2.jsonl", "DP"),
            view("real_ddp_mlp_ws2.jsonl", "DDP")]


@pytest.fixture(scope="module")
def ddp_events():
    return load("real_ddp_mlp_ws2.jsonl")


def check_chart(chart) -> dict:
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
