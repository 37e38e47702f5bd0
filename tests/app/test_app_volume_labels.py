"""Bytes are called what their events say they are (issue 20, item 9): Live and Compare name a
volume from its `volume_source` alone, "unlabelled" when it has none (never "measured"), and every
kind a chart draws has its own legend entry (FSDP's derived bytes included).

The reference is the source strings the engine writes, copied here by hand from
engine/modes/dp/emulated.py, dp/cuda.py, ddp/rank.py and fsdp/collectives.py."""

import pytest

from ddpviz.app.charts import compare as charts_compare
from ddpviz.app.charts import steps as charts_steps
from ddpviz.app.frames import compare as fc
from ddpviz.app.frames import steps as fsteps

SOURCES = {  # volume_source as the engine writes it -> the label both pages must show
    "measured": "measured",
    "measured: bytes of the tensors torch.nn.parallel copied": "measured",
    "derived (ring all-reduce)": "derived (ring all-reduce)",
    "derived (collective bytes x wire factor): measured tensor bytes of every all-gather and "
    "reduce-scatter x the backend's wire factor per rank": "derived (collective bytes x wire factor)",
    None: "unlabelled (older run)",
}


def _volume(mode, source, device="cpu:0", rank=0, sent=1 << 20):
    e = {"type": "comm_volume", "run_id": "r", "step": 3, "device": device, "rank": rank,
         "sent_bytes": sent, "recv_bytes": sent, "theory_sent_bytes": sent, "theory_recv_bytes": sent}
    if source is not None:
        e["volume_source"] = source
    return e


def _view(mode, events):
    return fc.RunView(label=mode, record={"config": {"mode": mode, "world_size": 2}},
                      events={"comm_volume": events})


@pytest.mark.parametrize("mode", ["dp", "ddp", "fsdp"])
@pytest.mark.parametrize("source", list(SOURCES))
def test_live_and_compare_name_a_volume_by_its_source_whatever_the_mode(mode, source):
    ev = _volume(mode, source)
    live = set(fsteps.comm_volume_frame([ev])["source"])
    compare = fc.bytes_frame([_view(mode, [ev])])
    compare = set(compare.loc[compare["which"] != "theory", "which"])
    assert live == compare == {SOURCES[source]}


def test_a_volume_without_source_is_never_called_measured_on_compare():
    row = fc.compare_frame([_view("dp", [_volume("dp", None)])]).iloc[0]
    assert row["bytes_source"] == "unlabelled (older run)"
    row = fc.compare_frame([_view("dp", [_volume("dp", "measured")])]).iloc[0]
    assert row["bytes_source"] == "measured"


def _legend_domain(spec):
    colours = [layer["encoding"]["color"] for layer in [spec] + spec.get("layer", [])
               if "color" in layer.get("encoding", {})]
    (colour,) = colours
    return colour["scale"]["domain"], colour["scale"]["range"]


@pytest.mark.parametrize("source", list(SOURCES))
def test_every_kind_the_live_bytes_chart_draws_has_a_legend_entry_and_colour(source):
    frame = fsteps.comm_volume_frame([_volume("fsdp", source, "cuda:0", 0),
                                      _volume("fsdp", source, "cuda:1", 1)])
    spec = charts_steps.comm_volume_chart(frame).to_dict()
    drawn = {r["which"] for r in next(iter(spec["datasets"].values()))}
    domain, colours = _legend_domain(spec)
    assert drawn == {SOURCES[source], "theory"} and set(domain) == drawn
    assert len(colours) == len(domain) and len(set(colours)) == len(colours)


def test_live_and_compare_colour_each_kind_the_same():
    evs = [_volume("fsdp", s, f"cpu:{i}", i) for i, s in enumerate(SOURCES)]
    live = dict(zip(*_legend_domain(charts_steps.comm_volume_chart(fsteps.comm_volume_frame(evs)).to_dict())))
    compare = dict(zip(*_legend_domain(charts_compare.bytes_chart(fc.bytes_frame([_view("fsdp", evs)])).to_dict())))
    assert set(live) == set(SOURCES.values()) | {"theory"} and live == compare


def test_each_ranks_latest_volume_is_shown_when_ranks_report_on_different_steps():
    """A launched DDP rank reports comm_volume on traced steps and when its bucket sizes change; ranks
    whose sizes differ (a sparse bucket) report on different steps. Hand-worked: rank 0 at steps 2 and
    50 (1 then 3 MiB), rank 1 at step 40 (2 MiB): both ranks are drawn, each with its newest bytes."""
    from ddpviz.app.frames import topology as ftop

    def vol(rank, step, mib):
        return {**_volume("ddp", "derived (ring all-reduce)", device="cpu:0", rank=rank, sent=mib << 20), "step": step}

    events = [vol(0, 2, 1), vol(1, 40, 2), vol(0, 50, 3)]
    assert [(e["rank"], e["step"]) for e in ftop.latest_volume(events)] == [(0, 50), (1, 40)]
    frame = fsteps.comm_volume_frame([dict(e, device=f"rank{e['rank']}") for e in events])
    assert frame["sent_mib"].tolist() == [3.0, 2.0] and frame["step"].tolist() == [50, 40]
    # the chart says which step each bar is from (in its data and tooltip: Live keeps a spec without step numbers)
    spec = charts_steps.comm_volume_chart(frame).to_dict()
    drawn = next(iter(spec["datasets"].values()))
    assert sorted((r["device"], r["step"]) for r in drawn if r["which"] != fsteps.THEORY) == [("rank0", 50), ("rank1", 40)]
    assert "step" in [t["field"] for t in spec["encoding"]["tooltip"]]
    run = fc.RunView(label="ddp", record={"config": {"mode": "ddp", "world_size": 2}}, events={"comm_volume": events})
    got = fc.bytes_frame([run])
    measured = got[got["which"] != fc.THEORY]
    assert measured["device"].tolist() == ["rank 0", "rank 1"]
    assert measured["mib"].tolist() == [6.0, 4.0]  # sent + received
