"""Memory over the whole run on Live (issue 20, item 8): the memory timer's readings
(`memory_readings`) are binned per device and source by the run window, turned into a frame and
drawn one chart per source. Values checked against readings worked by hand."""

import pytest

from ddpviz.app.charts import memory as charts_memory
from ddpviz.app.frames import memory as fm
from ddpviz.app.step_history import ReadingHistory
from ddpviz.app.window import RunWindow

MIB = 2**20
T0 = 1_000_000.0  # the run's start (unix s)


def _readings(device, ts, process, cuda=None, host=None):
    e = {"type": "memory_readings", "run_id": "r", "device": device, "reading_ts": ts,
         "bytes": {"process": process}, "interval_s": 0.05}
    if cuda is not None:
        e["bytes"]["cuda"] = cuda
    if host:
        e["host"] = host
    return e


def test_readings_are_binned_by_time_per_device_and_source():
    h = ReadingHistory(bin_s=1.0)
    # bin [T0, T0+1): 1, 3 MiB (mean 2); bin [T0+1, T0+2): 5 MiB and a missing reading (null)
    h.add(_readings("cuda:0", [T0 + 0.1, T0 + 0.6, T0 + 1.2, T0 + 1.5],
                    [MIB, 3 * MIB, 5 * MIB, None], cuda=[10 * MIB] * 4))
    df = fm.memory_over_run_frame(h.rows(), "run A", origin_ts=T0)
    proc = df[df["source"] == "process"]
    assert list(proc["readings"]) == [2, 1]
    assert list(proc["mib"]) == pytest.approx([2.0, 5.0])
    assert list(proc["lo_mib"]) == pytest.approx([1.0, 5.0]) and list(proc["hi_mib"]) == pytest.approx([3.0, 5.0])
    assert list(proc["t_s"]) == pytest.approx([0.35, 1.2])  # middle of each bin's readings
    assert list(df.loc[df["source"] == "cuda", "readings"]) == [2, 2] and h.readings == 7


def test_dps_devices_sharing_one_process_draw_one_rss_line():
    """DP's two devices' timers both read the one process's RSS (`process_shared`): one series, named
    as the step's chart names it, with every reading (the tour, issue 33: two lines for one process)."""
    h = ReadingHistory(bin_s=1.0)
    for device, mib in (("cpu:0", 100), ("cpu:1", 102)):
        h.add({**_readings(device, [T0 + 0.2, T0 + 0.7], [mib * MIB] * 2), "process_shared": True})
    h.add(_readings("cpu:2", [T0 + 0.2], [300 * MIB]))  # a process of its own (DDP's rank): its own line
    df = fm.memory_over_run_frame(h.rows(), "DP", origin_ts=T0)
    assert sorted(df["device"]) == sorted([fm.SHARED_PROCESS, "cpu:2"])
    shared = df[df["device"] == fm.SHARED_PROCESS].iloc[0]
    assert shared["readings"] == 4 and shared["mib"] == pytest.approx(101.0)  # (100 + 100 + 102 + 102) / 4


def test_bins_double_when_a_long_run_outgrows_them_and_lose_no_reading():
    h = ReadingHistory(max_bins=4, bin_s=1.0)
    ts = [T0 + i for i in range(16)]  # one reading a second, bytes = i MiB
    h.add(_readings("cpu:0", ts, [i * MIB for i in range(16)]))
    rows = h.rows()
    assert h.bin_s == 4.0 and len(rows) == 4 and sum(r["readings"] for r in rows) == 16
    assert [r["mean_bytes"] / MIB for r in rows] == pytest.approx([1.5, 5.5, 9.5, 13.5])
    assert [(r["lo_bytes"] / MIB, r["hi_bytes"] / MIB) for r in rows] == [(0, 3), (4, 7), (8, 11), (12, 15)]


class _Client:
    def __init__(self, events):
        self.events = events

    def get_run(self, run_id):
        return {"run_id": run_id, "status": "succeeded", "config": {"mode": "ddp", "steps": 2}}

    def read_events(self, run_id, after_id="0-0", count=2000):
        if after_id != "0-0":
            return [], after_id
        return self.events, "1-0"


def test_the_window_folds_every_reading_in_and_keeps_none_of_the_events():
    events = [{"type": "run_started", "run_id": "r", "ts": T0, "config": {"mode": "ddp", "steps": 2}}]
    for k in range(10):  # two ranks, 10 batches of 10 readings each, 20 per second
        for rank in range(2):
            ts = [T0 + 0.5 * k + 0.05 * i for i in range(10)]
            events.append(_readings(f"cpu:{rank}", ts, [(rank + 1) * 100 * MIB] * 10))
    w = RunWindow("r")
    w.poll(_Client(events))
    assert "memory_readings" not in w.events and w.memory_history.readings == 200
    df = fm.memory_over_run_frame(w.memory_history.rows(), "run", w.start_ts)
    assert df.groupby("device")["readings"].sum().to_dict() == {"cpu:0": 100, "cpu:1": 100}
    assert df.groupby("device")["mib"].mean().to_dict() == pytest.approx({"cpu:0": 100.0, "cpu:1": 200.0})
    assert df["t_s"].min() >= 0 and df["t_s"].max() <= 5.0


def test_one_chart_per_source_with_device_legend_and_titles():
    h = ReadingHistory(bin_s=1.0)
    h.add(_readings("cuda:0", [T0, T0 + 1], [MIB, 2 * MIB], cuda=[3 * MIB, 4 * MIB]))
    h.add(_readings("cuda:1", [T0, T0 + 1], [MIB, 2 * MIB], cuda=[5 * MIB, 6 * MIB]))
    charts = charts_memory.memory_over_run_charts(fm.memory_over_run_frame(h.rows(), "run A", T0), "run A")
    specs = [c.to_dict() for c in charts]
    assert len(specs) == 2
    for spec, source in zip(specs, ["cuda allocator", "process RSS (psutil)"]):
        assert source in spec["title"]["text"] and "measured" in " ".join(spec["title"]["subtitle"])
        line = spec["layer"][1]["encoding"]
        assert line["x"]["title"] == "seconds since the run started" and line["color"]["legend"]["title"] == "device"
        data = next(iter(spec["datasets"].values()))
        assert {d["device"] for d in data} == {"cuda:0", "cuda:1"}
    cuda = {(d["device"], round(d["t_s"])): d["mib"] for d in next(iter(specs[0]["datasets"].values()))}
    assert cuda == {("cuda:0", 0): 3.0, ("cuda:0", 1): 4.0, ("cuda:1", 0): 5.0, ("cuda:1", 1): 6.0}
    assert charts_memory.memory_over_run_charts(fm.memory_over_run_frame([], "x"), "x") == []


def test_a_run_shorter_than_one_bin_draws_each_devices_reading_as_a_point():
    """8 readings in 0.35 s, one bin per device: a step line of one point draws nothing (a new user's 30-step
    run showed empty axes before 2026-12-06); a point per device marks the bin's mean, and the subtitle says so."""
    h = ReadingHistory(bin_s=1.0)
    for dev, mib in (("cpu:0", 10), ("cpu:1", 12)):
        h.add(_readings(dev, [T0 + 0.05 * k for k in range(8)], [mib * MIB] * 8))
    spec = charts_memory.memory_over_run_charts(fm.memory_over_run_frame(h.rows(), "run A", T0), "run A")[0].to_dict()
    points = _visible_points(spec)
    data = {d["device"]: d["mib"] for d in next(iter(spec["datasets"].values()))}
    assert len(points) == 1 and points[0]["encoding"]["y"]["field"] == "mib"
    assert data == {"cpu:0": 10.0, "cpu:1": 12.0}
    assert "a point: the mean of the run's 16 reading(s)" in " ".join(spec["title"]["subtitle"])
    # two bins: lines as before, no points
    h.add(_readings("cpu:0", [T0 + 1.5], [11 * MIB]))
    h.add(_readings("cpu:1", [T0 + 1.5], [13 * MIB]))
    spec = charts_memory.memory_over_run_charts(fm.memory_over_run_frame(h.rows(), "run A", T0), "run A")[0].to_dict()
    assert _visible_points(spec) == []


def _visible_points(spec: dict) -> list[dict]:
    """The layers that draw points one can see (not the invisible extent layer, opacity 0)."""
    return [layer for layer in spec["layer"] if isinstance(layer["mark"], dict) and layer["mark"]["type"] == "point"
            and layer["mark"].get("opacity", 1) > 0]


def test_one_hosts_devices_are_named_as_every_other_chart_names_them_and_two_hosts_keep_theirs():
    """An attached run's readings carry their host: the chart read "vm/cpu:0" beside every other chart's "cpu:0"
    (a new user, 2026-12-06). Across two hosts the host stays: "cpu:0" would then name two devices."""
    one = ReadingHistory(bin_s=1.0)
    for device in ("cpu:0", "cpu:1"):
        one.add(_readings(device, [T0 + 0.2], [MIB], host="vm"))
    assert sorted(fm.memory_over_run_frame(one.rows(), "run", origin_ts=T0)["device"]) == ["cpu:0", "cpu:1"]
    two = ReadingHistory(bin_s=1.0)
    for host in ("node-a", "node-b"):
        two.add(_readings("cpu:0", [T0 + 0.2], [MIB], host=host))
    assert sorted(fm.memory_over_run_frame(two.rows(), "run", origin_ts=T0)["device"]) == ["node-a/cpu:0",
                                                                                          "node-b/cpu:0"]


def test_sixty_four_devices_draw_no_legend_that_would_crush_the_plot():
    """64 devices' legend (4 columns, 16 rows) left the plot ~10 px under "...35 entries" (a new user,
    2026-12-06): past 16 devices the lines keep their colours and tooltips, without a legend."""
    for n in (16, 64):
        h = ReadingHistory(bin_s=1.0)
        for d in range(n):
            h.add(_readings(f"cpu:{d}", [T0, T0 + 1], [MIB, 2 * MIB]))
        spec = charts_memory.memory_over_run_charts(fm.memory_over_run_frame(h.rows(), "DP", T0), "DP")[0].to_dict()
        legend = spec["layer"][1]["encoding"]["color"].get("legend", "absent")
        assert (legend is None) == (n == 64), (n, legend)
        assert spec["layer"][1]["encoding"]["tooltip"][0]["field"] == "device"
