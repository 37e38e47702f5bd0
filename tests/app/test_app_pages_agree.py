"""Pages that agree (issue 21): DP's copies are never called exposed comm, one colour per mode,
a DP timeline that opens on a typical step, memory axes that end at the data. On the recorded real
runs of tests/app/data, read back against their own events."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest
from recorded import DATA, FILES

from app.frames import compare as fc
from app.frames import steps as fsteps


def _view(mode: str) -> fc.RunView:
    events = [json.loads(line) for line in (DATA / FILES[mode]).read_text().splitlines() if line.strip()]
    by_type = defaultdict(list)
    for e in events:
        by_type[e["type"]].append(e)
    started, finished = by_type["run_started"][0], by_type["run_finished"][-1]
    record = {"config": started["config"], "summary": finished["summary"], "status": "succeeded"}
    return fc.RunView(label=mode.upper(), record=record, events=dict(by_type), started=started,
                      finished=finished)


@pytest.fixture(scope="module")
def views():
    return {m: _view(m) for m in ("dp", "ddp", "single")}


def test_dp_copies_are_never_called_exposed_comm(views):
    dp, ddp = views["dp"], views["ddp"]
    table = fc.side_by_side(fc.compare_frame([dp, ddp])).set_index("measure")
    copies = f"  {fsteps.DP_COPIES} (ms)"
    assert table.loc["  exposed comm (ms)", "DP"] == "—"
    assert table.loc[copies, "DP"] == f"{dp.summary['comm_exposed_s'] * 1e3:.2f}"  # its copies' time
    assert table.loc["  exposed comm (ms)", "DDP"] == f"{ddp.summary['comm_exposed_s'] * 1e3:.2f}"
    assert table.loc[copies, "DDP"] == "—"
    steps = fsteps.steps_frame(dp.of_type("step"), "DP")
    split = fsteps.split_frame(steps, {"DP": "dp"})
    assert fsteps.DP_COPIES in set(split["part"]) and "exposed comm" not in set(split["part"])
    ddp_split = fsteps.split_frame(fsteps.steps_frame(ddp.of_type("step"), "DDP"), {"DDP": "ddp"})
    assert "exposed comm" in set(ddp_split["part"]) and fsteps.DP_COPIES not in set(ddp_split["part"])
    # the chart's legend names only the parts present
    from app.charts.steps import split_chart

    legend = split_chart(split).to_dict()["encoding"]["color"]["scale"]["domain"]
    assert fsteps.DP_COPIES in legend and "exposed comm" not in legend
