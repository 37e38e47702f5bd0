"""View defects found by reviewers (2026-12-06), each checked against what the chart or text must say, not a number
the code under test produced: a single run's step split names no communication, the Theory legend's symbols are
the marks drawn, Scale-out says why efficiency collapses with a CPU host's measured compute, and Live's run picker
tells two runs of one label apart."""

from __future__ import annotations

import json
import re

import pytest
from recorded import CONFIG, DATA, FILES

from ddpviz.app.charts import theory as charts_theory
from ddpviz.app.frames import steps as fsteps
from ddpviz.app.frames import theory as ft

NO_COMM = {"forward", "backward", "optimizer", "other"}  # what a step of one device is made of


def _events(name: str, run_id: str | None = None, **started) -> list[dict]:
    out = [json.loads(line) for line in (DATA / name).read_text().splitlines() if line.strip()]
    out = [{**e, "run_id": run_id} if run_id else e for e in out]
    return [{**e, **started} if e["type"] == "run_started" else e for e in out]


def _spec(at, title: str) -> dict:
    for c in at.get("vega_lite_chart"):
        spec = json.loads(c.proto.spec)
        if (spec.get("title") or {}).get("text") == title:
            return spec
    raise AssertionError(f"no chart titled {title!r}")


# -- 1: a single run's step split ---------------------------------------------------------------------------

def test_a_single_runs_step_split_names_no_communication(fake_client, app_test):
    """One device communicates with nobody: its split, legend, colour domain and caption name only forward,
    backward, optimizer and other; a DDP run's split still names its exposed comm."""
    events = _events(FILES["single"], "s1")
    fake_client.add_run("s1", {"mode": "single", "world_size": 1, "steps": 12}, status="succeeded", events=events)
    at = app_test("views/live.py", runs="s1")
    assert not at.exception, [e.value for e in at.exception]
    split = _spec(at, "Step time split")
    domain = split["layer"][0]["encoding"]["color"]["scale"]["domain"]
    assert {"forward", "backward", "optimizer"} <= set(domain) <= NO_COMM, domain
    words = " ".join(c.value for c in at.caption)
    assert "exposed comm" not in words and fsteps.DP_COPIES_PART not in words
    steps = fsteps.steps_frame([e for e in events if e["type"] == "step"], "single")
    assert set(fsteps.split_frame(steps, {"single": "single"})["part"]) <= NO_COMM
    ddp = fsteps.steps_frame([e for e in _events(FILES["ddp"]) if e["type"] == "step"], "DDP")
    assert fsteps.EXPOSED_COMM_PART in set(fsteps.split_frame(ddp, {"DDP": "ddp"})["part"])


def test_the_compare_table_gives_a_single_run_no_exposed_comm():
    """The Compare table's exposed comm of a single run is a dash, as DP's is, never "0.00"."""
    from ddpviz.app.frames import compare as fc

    from test_app_pages_agree import _view

    table = fc.side_by_side(fc.compare_frame([_view("single"), _view("ddp")])).set_index("measure")
    assert table.loc["  exposed comm (ms)", "SINGLE"] == "—"
    assert table.loc["  exposed comm (ms)", "DDP"] != "—"


# -- 2: the Theory legend -----------------------------------------------------------------------------------

def _lookup(expr: dict) -> dict:
    """The per-series table of a legend property `{"expr": "<JSON object>[datum.value]"}`."""
    text = expr["expr"]
    assert text.endswith("[datum.value]"), text
    return json.loads(text.removesuffix("[datum.value]"))


def _drawn(spec: dict) -> dict[str, list[dict]]:
    """series -> the marks its rows are drawn with (each layer's mark and the series in its data)."""
    out: dict[str, list[dict]] = {}
    for layer in spec["layer"]:
        mark = layer["mark"] if isinstance(layer["mark"], dict) else {"type": layer["mark"]}
        for s in {row["series"] for row in spec["datasets"][layer["data"]["name"]]}:
            out.setdefault(s, []).append(mark)
    return out


@pytest.mark.parametrize("chart", [charts_theory.bandwidth_chart, charts_theory.time_chart])
def test_the_theory_legend_draws_each_series_as_its_marks(chart):
    """A series drawn with points has a circle in the legend (filled if any of its points are, else a ring);
    one drawn as lines only has a line, dashed as its line is. The fitted models were filled circles."""
    events = _events(FILES["ddp-probe"])
    probe = ft.latest_probe(events)
    pf, bk = ft.probe_frame(probe), ft.bucket_frame(events, 2, min_step=1)
    model, _ = ft.bucket_fit(events, 2)
    lines = ft.model_lines({ft.FIT_PROBE: probe["fit"], ft.FIT_BUCKETS: model}, *ft.size_range(pf, bk), 2)
    spec = chart(pf, bk, lines, run="DDP").to_dict()
    colour = spec["layer"][0]["encoding"]["color"]
    legend, domain = colour["legend"], colour["scale"]["domain"]
    shapes, dashes = _lookup(legend["symbolType"]), _lookup(legend["symbolDash"])
    drawn = _drawn(spec)
    assert set(drawn) == set(domain) and {ft.FIT_PROBE, ft.FIT_BUCKETS, ft.OVERLAPPED} <= set(domain)
    for series, marks in drawn.items():
        points = [m for m in marks if m["type"] == "point"]
        if points:
            filled = any(m.get("filled") for m in points)
            assert shapes[series] == ("circle" if filled else charts_theory.RING), series
            assert dashes[series] == [], series
        else:
            assert {m["type"] for m in marks} == {"line"} and shapes[series] == "stroke", series
            assert dashes[series] == marks[0].get("strokeDash", []), series
    assert dashes[ft.FIT_PROBE] and shapes[ft.FIT_PROBE] == "stroke"  # the defect: a filled circle
    assert charts_theory.RING.count("M") == 2  # two circles, the inner one cut out: a ring, not a dot


@pytest.mark.parametrize("chart", [charts_theory.bandwidth_chart, charts_theory.time_chart])
def test_the_theory_subtitle_names_only_the_marks_drawn(chart):
    """"hollow ochre: overlapped buckets" only where a bucket overlapped; the dashed models only where drawn."""
    events = _events(FILES["ddp-probe"])
    probe = ft.latest_probe(events)
    pf, bk = ft.probe_frame(probe), ft.bucket_frame(events, 2, min_step=1)
    model, _ = ft.bucket_fit(events, 2)
    lines = ft.model_lines({ft.FIT_PROBE: probe["fit"], ft.FIT_BUCKETS: model}, *ft.size_range(pf, bk), 2)
    assert not bk["alone"].astype(bool).all() and bk["alone"].astype(bool).any()  # the recording has both kinds

    def subtitle(buckets, lines):
        sub = chart(pf, buckets, lines, run="DDP").to_dict()["title"]["subtitle"]
        return " ".join(sub) if isinstance(sub, list) else sub

    assert "hollow ochre: overlapped buckets" in subtitle(bk, lines) and "Dashed: fitted" in subtitle(bk, lines)
    alone_only = subtitle(bk[bk["alone"].astype(bool)], lines)
    assert "overlapped" not in alone_only and "Dashed: fitted" in alone_only
    assert "Dashed" not in subtitle(bk, lines.iloc[0:0])


# -- 3: Scale-out on a small CPU host -----------------------------------------------------------------------

CORES = 2  # the recorded runs ran on a 2-core VM; their run_started predates `host_cpu_count`


def _cpu_trio(client) -> dict[str, str]:
    """The recorded single/DP/DDP/FSDP set, its run_started saying the host had `CORES` cores (1 thread each)."""
    from ddpviz.workers.sink import RedisStreamWriter
    from ddpviz.workers.store import RunStatus
    from ddpviz.workers.sweeps import submit_trio

    _, ids = submit_trio(client, CONFIG)
    for mode, rid in ids.items():
        events = _events(FILES[mode], rid, host_cpu_count=CORES, cpu_threads_per_device=1)
        client.store.mark_started(rid, "test-worker")
        RedisStreamWriter(client.redis, rid).write_batch(events)
        client.store.finish(rid, RunStatus.SUCCEEDED, summary=events[-1].get("summary"))
    return ids


def _ms(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"([0-9.]+) ms", text)]


def test_scaleout_says_why_efficiency_falls_with_a_cpu_hosts_measured_compute(real_client, app_test):
    """With compute as measured on a 2-core host a DDP rank's own work grows with n (ranks time-share
    the cores): a caption says so, naming the cores, the run and both times, as the report has them; with a GPU
    compute preset, where nothing grows, it is not there."""
    from ddpviz.app.frames import scaleout as fso
    from ddpviz.workers.scaleout import report, scenario_from

    ids = _cpu_trio(real_client)
    rep = report(real_client, ids["ddp"], [1, 2, 4, 8], scenario_from())
    cal = rep["calibration"]["ddp"]
    at8 = next(p for p in rep["predictions"] if p["mode"] == "ddp" and p["world_size"] == 8)
    measured_s = cal["forward_s"] + cal["backward_s"] + cal["optimizer_s"]
    predicted_s = at8["forward_s"] + at8["backward_s"] + at8["optimizer_s"]
    assert predicted_s > 1.5 * measured_s  # the premise: the compute grows on this host
    text = fso.host_slowdown_text(rep, as_measured=True, fitted_link=True)
    assert text and f"{CORES} CPU cores" in text and "grows with world size" in text and "time-share" in text
    assert ids["ddp"][:8] in text and "n = 2" in text and "n = 8" in text
    assert _ms(text)[:2] == pytest.approx([measured_s * 1e3, predicted_s * 1e3], abs=0.006)
    gpu = report(real_client, ids["ddp"], [1, 2, 4, 8], scenario_from("pcie4", compute_key="h100"))
    assert fso.host_slowdown_text(gpu, as_measured=False, fitted_link=False) is None
    at = app_test("views/scaleout.py", run=ids["ddp"], link="this-machine", compute="as-measured")
    assert not at.exception, [e.value for e in at.exception]
    assert any(c.value.startswith("Why efficiency falls") and "16" in c.value for c in at.caption)
    at = app_test("views/scaleout.py", run=ids["ddp"], link="this-machine", compute="h100")
    assert not any("Why efficiency falls" in c.value for c in at.caption)


def test_no_slowdown_caption_on_a_gpu_run_or_when_compute_does_not_grow():
    from ddpviz.app.frames import scaleout as fso

    def rep(kind: str, at8_ms: float) -> dict:
        rows = [dict(mode="ddp", world_size=n, forward_s=f / 4e3, backward_s=2 * f / 4e3, optimizer_s=f / 4e3)
                for n, f in ((2, 4.0), (8, at8_ms))]
        return {"predictions": rows,
                "calibration": {"ddp": dict(run_id="r" * 16, world_size=2, device_kind=kind, host_cpu_count=2)}}

    here = dict(as_measured=True, fitted_link=True)
    assert fso.host_slowdown_text(rep("cpu", 12.0), **here)
    assert fso.host_slowdown_text(rep("cuda", 12.0), **here) is None  # GPUs do not time-share cores
    assert fso.host_slowdown_text(rep("cpu", 1.0), **here) is None  # compute shrinks with n: nothing to explain
    assert fso.host_slowdown_text(rep("cpu", 12.0), as_measured=False, fitted_link=True) is None  # a GPU preset


# -- 4: Live's run picker -----------------------------------------------------------------------------------

def test_lives_run_picker_tells_two_ddp_runs_apart(fake_client, app_test):
    """Two pairs launched without a name: both DDP runs are labelled "DDP"; every picker entry differs and a
    shared label carries its run's short id."""
    import eventgen as g

    for i, t in enumerate((1_000.0, 2_000.0)):
        for mode in ("dp", "ddp"):
            rid = f"{mode}{i}aaaaaaaaaaaa"
            fake_client.add_run(rid, {"mode": mode, "steps": 4}, status="succeeded", label=mode.upper(),
                                group=f"g{i}", created_at=g.T0 + t, events=g.full_run(rid, mode))
    at = app_test("views/live.py")
    assert not at.exception, [e.value for e in at.exception]
    picker = at.multiselect(key="live_pick")
    shown = picker.options
    assert len(shown) == len(set(shown)) == 4, shown
    ddp = [o for o in shown if o.startswith("DDP")]
    assert len(ddp) == 2 and {o for o in ddp if "ddp0aa" in o} and {o for o in ddp if "ddp1aa" in o}, ddp


# -- found looking at the pages -----------------------------------------------------------------------------

def test_the_sweeps_table_gives_a_single_run_no_comm():
    from ddpviz.app.frames import sweeps as fs

    runs = [{"run_id": f"{m}0000000", "status": "succeeded", "config": {"mode": m, "world_size": n},
             "summary": {"samples_per_s": 100.0, "step_time_s": 0.01, "comm_exposed_s": c}}
            for m, n, c in (("single", 1, 0.0), ("dp", 2, 0.002), ("dp", 1, 0.0), ("ddp", 1, 0.00015))]
    comm = list(fs.sweep_frame(runs)["comm_exposed_ms"])
    assert comm[0] is None or comm[0] != comm[0]  # blank ("—"), not 0.00
    assert comm[1] == pytest.approx(2.0)
    assert comm[2] is None or comm[2] != comm[2]  # DP on one device runs the module itself: no copies to time
    assert comm[3] == pytest.approx(0.15)  # DDP on one rank all-reduces over a group of one: measured


def test_sweeps_efficiency_far_above_linear_points_at_the_baseline():
    """A single-device baseline slowed while it ran (it shared 2 cores with the sweep's other runs) put DP
    and DDP at 600% of linear with nothing said; the subtitle now names how many, the highest and the baseline."""
    import pandas as pd

    from ddpviz.app.charts import sweeps as cs

    rates = {("single", 1): 1_851.0, ("dp", 2): 24_287.0, ("ddp", 2): 23_655.0, ("ddp", 4): 10_518.0}
    eff = pd.DataFrame([dict(label=f"{m}{n}", mode=m, world_size=n, samples_per_s=s, speedup=s / 1_851.0,
                             efficiency=s / 1_851.0 / n) for (m, n), s in rates.items()])
    sub = " ".join(cs.efficiency_chart(eff).to_dict()["title"]["subtitle"])
    top = max(24_287.0, 23_655.0) / 1_851.0 / 2
    assert f"2 run(s) above 150% (up to {top:.0%})" in sub  # DDP on 4: 142% and "1,851 samples/s" in sub
    eff["efficiency"] = [1.0, 0.9, 0.8, 0.5]
    assert "above 150%" not in " ".join(cs.efficiency_chart(eff).to_dict()["title"]["subtitle"])


def test_scaleout_never_says_ddp_does_not_pull_ahead_where_it_is_ahead():
    """On a CPU host DDP is ahead at the run's own n = 2 and behind beyond the cores: the sentence names both."""
    from ddpviz.app.frames import scaleout as fso

    rows = [("dp", 1, 10), ("ddp", 1, 10), ("dp", 2, 17), ("ddp", 2, 18), ("dp", 4, 30), ("ddp", 4, 20),
            ("dp", 8, 35), ("ddp", 8, 15)]
    rep = {"predictions": [dict(mode=m, world_size=n, samples_per_s=s, efficiency=1, step_time_s=1,
                                comm_exposed_s=0, comm_s=0) for m, n, s in rows]}
    text = fso.crossover_text(rep)
    assert "ahead of DP's at n = 2 and behind at n = 4, 8" in text and "does not pull ahead" not in text
    rep["predictions"] = [{**p, "samples_per_s": 1} if p["mode"] == "ddp" else p for p in rep["predictions"]]
    assert fso.crossover_text(rep) == "Predicted: DDP does not pull ahead of DP at these world sizes."


def _steps(run: str, rates: list[float]):
    import pandas as pd

    return pd.DataFrame({"run": run, "step": range(len(rates)), "samples_per_s": rates, "instrument": False})


def test_the_live_ratio_waits_for_the_verdicts_steady_steps(fake_client, app_test):
    """A pair in turns: DP's ten steps against DDP's one warm-up step read "17.54× DDP" under "No verdict yet".
    The ratio now waits until both runs have the verdict's steady steps, and says so meanwhile."""
    import eventgen as g
    import pandas as pd

    from ddpviz.engine.verdict import MIN_STEADY_STEPS

    early = fsteps.throughput_tiles(pd.concat([_steps("DP", [1000.0] * 10), _steps("DDP", [50.0])]),
                                    MIN_STEADY_STEPS)
    assert early["DP"][1] == early["DDP"][1] == f"ratio after {MIN_STEADY_STEPS} steady steps"
    later = fsteps.throughput_tiles(pd.concat([_steps("DP", [1000.0] * 12), _steps("DDP", [2000.0] * 12)]),
                                    MIN_STEADY_STEPS)
    assert later == {"DP": (1000.0, "0.50× DDP"), "DDP": (2000.0, "2.00× DP")}
    # an ended run's tile is its summary's figure (every steady step), where the window holds only its newest
    # steps or a trimmed stream's tail (a 64-device DP run read 1,483 against its summary's 1,251)
    ended = fsteps.throughput_tiles(pd.concat([_steps("DP", [1000.0] * 12), _steps("DDP", [2000.0] * 12)]),
                                    MIN_STEADY_STEPS, {"DP": 1251.0, "DDP": None})
    assert ended == {"DP": (1251.0, "0.63× DDP"), "DDP": (2000.0, "1.60× DP")}
    fake_client.add_run("p", {"mode": "dp", "steps": 10}, status="started", label="DP",
                        events=g.full_run("p", "dp", steps=10)[:-1])
    fake_client.add_run("d", {"mode": "ddp", "steps": 10}, status="started", label="DDP",
                        events=g.full_run("d", "ddp", steps=1)[:-1])
    at = app_test("views/live.py", runs="p,d")
    assert not at.exception, [e.value for e in at.exception]
    assert [m.delta for m in at.metric] == [f"ratio after {MIN_STEADY_STEPS} steady steps"] * 2


def test_the_split_caption_names_the_steps_its_medians_use():
    """The split's medians skip the warm-up (`engine.summary.steady_positions`), as the throughput median does:
    its caption said "Steps after the first"."""
    from ddpviz.engine.summary import steady_positions

    first = steady_positions([False] * 20)[0]
    note = fsteps.split_note({"forward"})
    assert f"after the first {first}," in note and "Steps after the first," not in note


def _plot_px(spec: dict) -> int:
    """A chart's height less the room its title lines past two get (`app.charts.style.TITLE_LINE_PX` each):
    what Streamlit's autosize "fit" leaves the plot."""
    from ddpviz.app.charts.style import TITLE_LINE_PX

    t = spec["title"]
    lines = sum(len(v) if isinstance(v, list) else int(bool(v)) for v in (t["text"], t.get("subtitle")))
    return spec["height"] - TITLE_LINE_PX * max(0, lines - 2)


def test_a_long_efficiency_subtitle_gets_room_not_a_cut_title():
    """Scale-out's clamp note (4-5 subtitle lines) pushed the efficiency chart's title out of its box and shrank
    its plot beside the throughput chart (seen in Chromium); so did the Sweeps note. Each plot now keeps its
    neighbour's size."""
    import pandas as pd

    from ddpviz.app.charts import scaleout as cso
    from ddpviz.app.charts import sweeps as csw

    pred = pd.DataFrame([dict(mode=m, series=f"{m.upper()} (predicted)", kind="predicted", world_size=n, nnodes=1,
                              samples_per_s=100.0 * n, efficiency=1.0 / n, step_time_ms=1.0, comm_ms=0.0,
                              busiest_bytes=0.0) for m in ("dp", "ddp") for n in (1, 2, 4)])
    measured = pd.DataFrame([dict(mode="ddp", series="DDP (measured)", kind="measured", world_size=2, nnodes=1,
                                  samples_per_s=150.0, efficiency=7.15, step_time_ms=1.0, comm_ms=None,
                                  busiest_bytes=None, run_id="r1")])
    eff = cso.efficiency_chart(pred, measured, scenario="this machine's link, measured compute").to_dict()
    assert "above the axis" in " ".join(eff["title"]["subtitle"]) and len(eff["title"]["subtitle"]) >= 4
    tput = cso.predicted_throughput_chart(pred, measured, scenario="this machine's link, measured compute").to_dict()
    assert _plot_px(eff) == _plot_px(tput)
    rows = pd.DataFrame([dict(label=f"{m}{n}", mode=m, world_size=n, samples_per_s=s, speedup=s / 1_851.0,
                              efficiency=s / 1_851.0 / n) for m, n, s in (("single", 1, 1_851.0), ("dp", 2, 24_287.0))])
    swept = csw.efficiency_chart(rows).to_dict()
    assert "above 150%" in " ".join(swept["title"]["subtitle"])
    assert _plot_px(swept) == _plot_px(csw.throughput_vs_world_chart(rows).to_dict())


@pytest.mark.parametrize("cap,text", [(0.0049991607666015625, "0.005"), (25.0, "25"), (0.1, "0.1"), (1000.0, "1,000"),
                                      (1234.5, "1,230"), (0.25, "0.25"), (None, "None")])
def test_a_bucket_cap_reads_in_plain_digits(cap, text):
    """3 significant digits, never "1e+03" (a new user's 1,000 MiB cap for PowerSGD on gloo read so)."""
    from ddpviz.app.frames.buckets import cap_text

    assert cap_text(cap) == text


def test_a_runs_label_is_shown_as_typed_in_markdown_never_as_markdown(fake_client, app_test):
    """A label ':red[ALERT] **bold** $x^2$ [link](http://example.com)' rendered red text, bold, LaTeX and a live
    link in Live's header and tiles (a new user, 2026-12-06): every Markdown character is escaped."""
    import eventgen as g

    from ddpviz.app.widgets import plain

    label = ":red[ALERT] **bold** $x^2$ [link](http://example.com)"
    # by hand: a backslash before each ASCII punctuation character Markdown, directives or LaTeX act on
    assert plain(label) == r"\:red\[ALERT\] \*\*bold\*\* \$x\^2\$ \[link\]\(http\://example\.com\)"
    fake_client.add_run("m", {"mode": "ddp", "steps": 10}, status="succeeded", label=label,
                        events=g.full_run("m", "ddp", steps=10))
    at = app_test("views/live.py", runs="m")
    assert not at.exception, [e.value for e in at.exception]
    shown = [e.value for e in at.markdown] + [e.label for e in at.metric] + [e.value for e in at.caption]
    assert any(plain(label) in text for text in shown)
    assert not any("[link](http" in text or ":red[" in text for text in shown)
