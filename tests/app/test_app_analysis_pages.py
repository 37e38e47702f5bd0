"""The analysis pages in AppTest, on recorded real runs played into a real Redis (and, for the
cases a recording cannot produce — GPUs, an outage — the in-memory client)."""

import json

import eventgen as g
import redis
from recorded import CONFIG, overlap_pair, play, trio

from ddpviz.workers.heartbeat import Heartbeat
from ddpviz.workers.sweeps import submit_sweep


def _titles(at) -> list[str]:
    return [json.loads(c.proto.spec)["title"]["text"] for c in at.get("vega_lite_chart")]


def _one_line(titles: list) -> list[str]:
    """Titles as one line each: a wrapped one's lines joined, no-break spaces as spaces."""
    return [" ".join(t if isinstance(t, list) else [t]).replace("\u00a0", " ") for t in titles]


def _ok(at) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def test_compare_page_side_by_side(real_client, app_test):
    _, ids = trio(real_client)
    at = app_test("views/compare.py")
    _ok(at)
    assert _titles(at) == ["Peak memory per device", "Throughput per step", "Loss per step",
                           "Step time split", "Speed-up over one device",
                           "Bytes moved per device per step"]
    table = at.table[0].value  # a static table: long values wrap, never cut
    assert list(table.columns) == ["measure", "single", "DP", "DDP", "FSDP"]
    assert table.set_index("measure").loc["replicas in sync", "DP"] == "rebuilt each step; as computed with: yes"
    speed = table.set_index("measure").loc["speed-up vs single"]
    assert speed["single"] == "1.00×" and speed["DP"].endswith("×") and speed["FSDP"].endswith("×")
    assert [m.label for m in at.metric] == [f"{r}: peak memory" for r in ("single", "DP", "DDP", "FSDP")]
    peak = table.set_index("measure").loc["peak memory, busiest device (MiB)"]
    assert float(peak["FSDP"]) < float(peak["DDP"])  # the headline: sharding holds less per rank
    # the same set through a link (?runs=), e.g. from the Runs page
    at = app_test("views/compare.py", runs=",".join(ids.values()))
    _ok(at)
    assert len(_titles(at)) == 6
    # the verdict's parts are means, the table's medians: said under the table (the tour, issue 33)
    from ddpviz.app.explain import MEANS_AND_MEDIANS

    assert MEANS_AND_MEDIANS in [c.value for c in at.caption] and "*medians*" in MEANS_AND_MEDIANS


def test_compare_page_launches_a_trio(real_client, app_test):
    at = app_test("views/compare.py")
    assert "No run sets yet" in at.info[0].value
    at.number_input(key="cmp_steps").set_value(3)
    at.button(key="compare_launch_trio").click().run()
    _ok(at)
    runs = real_client.list_runs()
    assert sorted(r["config"]["mode"] for r in runs) == ["ddp", "dp", "fsdp", "single"]
    assert len({r["group"] for r in runs}) == 1 and {r["config"]["steps"] for r in runs} == {3}
    assert at.session_state["focus_group"] == runs[0]["group"]


def test_launch_page_trio_button(fake_client, app_test):
    at = app_test()
    at.segmented_control(key="launch_what").set_value("trio").run()
    at.button(key="launch_trio").click().run()
    assert not at.exception
    assert [c["mode"] for c in fake_client.submitted] == ["single", "dp", "ddp", "fsdp"]
    assert len({r["group"] for r in fake_client.runs.values()}) == 1
    links = [p.proto.page for p in at.get("page_link")]
    assert "views/compare.py" in str(links) or len(at.get("page_link")) == 2


def test_bucket_timeline_page_overlap_on_off(real_client, app_test):
    _, ids = overlap_pair(real_client)
    at = app_test("views/buckets.py")
    _ok(at)
    # opens on a typical step: 5, whose 16.46 ms is the median of steps 3-11 of the overlap-on run
    # (by hand from the recording), not the latest (11); every recorded step was memory-traced
    assert _titles(at) == ["DDP overlap on: step 5", "DDP overlap off: step 5",
                           "Exposed communication per step"]
    assert at.segmented_control(key="buckets_step").options == \
        [f"step {s} (instrumented)" for s in [0, 1] + list(range(4, 12))]
    initial, rebuilt = at.dataframe[0].value, at.dataframe[1].value  # one layout: same config
    assert len(initial) == 1 and len(rebuilt) == 3
    # which tables are the preview and which line is measured (the tour, issue 33)
    assert any(c.value.startswith("Both tables are the preview") for c in at.caption)
    assert any(c.value.startswith("Measured in this run") and c.value.endswith("the tables above are the preview.")
               for c in at.caption)
    assert len(at.dataframe) == 2
    at.segmented_control(key="buckets_step").set_value(0).run()
    _ok(at)
    assert _titles(at)[:2] == ["DDP overlap on: step 0", "DDP overlap off: step 0"]
    spec = json.loads(at.get("vega_lite_chart")[0].proto.spec)
    assert " ".join(spec["title"]["subtitle"]).startswith("1 bucket(s) per rank")  # before the rebuild


def test_dp_timeline_page(real_client, app_test):
    trio(real_client)
    at = app_test("views/dp_timeline.py")
    _ok(at)
    # opens on a typical step (9: nearest the steady steps' median), not the latest (11, replica check)
    assert _titles(at) == ["DP: step 9", "DP: busy time per device by phase"]
    captions = " ".join(c.value for c in at.caption)
    assert "idle" in captions and "emulated" in captions and "Both devices wait" in captions


def test_theory_page_without_a_probe(real_client, app_test):
    trio(real_client)  # recorded before the probe existed
    at = app_test("views/theory.py")
    _ok(at)
    assert _titles(at) == ["DDP: all-reduce bandwidth vs message size",
                           "DDP: all-reduce time vs message size", "Bytes moved per device per step"]
    assert any(c.value.startswith("No all-reduce probe in this run") for c in at.caption)
    text = " ".join(m.value for m in at.markdown)
    assert "**In-run buckets**" in text and "ran alone" in text and "**Probe**" not in text


def test_theory_page_with_the_probe(real_client, app_test):
    trio(real_client, ddp="ddp-probe")
    at = app_test("views/theory.py")
    _ok(at)
    assert _titles(at)[:2] == ["DDP: all-reduce bandwidth vs message size",
                               "DDP: all-reduce time vs message size"]
    text = " ".join(m.value for m in at.markdown)
    assert "**Probe** (measured after training, gloo, float32)" in text
    assert "Ring model fitted to the" in text and "In-run bucket busbw ÷ probe busbw" in text
    spec = json.loads(at.get("vega_lite_chart")[0].proto.spec)
    legend = {s for layer in spec["layer"] for s in layer["encoding"]["color"]["scale"]["domain"]}
    assert {"probe busbw (measured)", "ring model fitted to the probe (fitted model)",
            "in-run bucket, ran alone (measured)"} <= legend


def test_learn_page(real_client, app_test):
    trio(real_client)
    at = app_test("views/learn.py")
    _ok(at)
    assert _one_line(_titles(at)) == [
        "DP: the star", "DDP: the ring", "star (DP), n = 8 (theory)", "ring (DDP), n = 8 (theory)",
        "tree (one of NCCL's two), n = 8 (theory)", "Shards, gather, scatter: unit 'hidden.1'"]
    text = " ".join(m.value for m in at.markdown)
    assert "a star" in text and "a ring" in text and "the tree" in text and "shards, gather, scatter" in text
    # the runs have 2 devices: the theory drawings open at n = 8, and the slider redraws them
    at.select_slider(key="learn_theory_n").set_value(16).run()
    assert "tree (one of NCCL's two), n = 16 (theory)" in _one_line(_titles(at))


def test_sweeps_page_world_size(real_client, app_test):
    sweep = submit_sweep(real_client, CONFIG, "world_size", [2])
    for r in real_client.list_runs():
        play(real_client, r["run_id"], f"real_{r['config']['mode']}_mlp_ws2.jsonl")
    at = app_test("views/sweeps.py")
    _ok(at)
    assert at.selectbox(key="sweep_pick").value == sweep
    assert _titles(at) == ["Scaling efficiency vs world size", "Throughput vs world size"]
    table = at.dataframe[0].value
    assert sorted(table["label"]) == ["DDP ×2", "DP ×2", "single"]


def test_sweeps_page_launches_a_bucket_sweep(real_client, app_test):
    at = app_test("views/sweeps.py")
    at.radio(key="sweep_kind").set_value("bucket_cap_mb").run()
    at.text_input(key="sweep_values_bucket_cap_mb").input("0.1, 1")
    at.button(key="sweep_launch").click().run()
    _ok(at)
    runs = real_client.list_runs()
    assert sorted(r["config"]["bucket_cap_mb"] for r in runs) == [0.1, 1.0]
    assert {r["config"]["mode"] for r in runs} == {"ddp"}
    play(real_client, runs[0]["run_id"], "real_ddp_mlp_ws2.jsonl")
    at = app_test("views/sweeps.py")
    _ok(at)
    assert "Step time vs bucket size" in _titles(at)


def test_sweeps_page_refuses_bad_values(real_client, app_test):
    at = app_test("views/sweeps.py")
    at.text_input(key="sweep_values_world_size").input("2, 3")  # 64 % 3 != 0
    at.button(key="sweep_launch").click().run()
    assert "global_batch_size" in at.error[0].value and "DP ×3" in at.error[0].value
    assert real_client.list_runs() == []


def test_runs_page_filters_and_exports(real_client, app_test):
    _, ids = trio(real_client)
    at = app_test("views/runs.py")
    _ok(at)
    assert len(at.dataframe[0].value) == 4  # single, DP, DDP, FSDP
    at.multiselect(key="runs_mode").select("dp").run()
    assert at.dataframe[0].value["run_id"].tolist() == [ids["dp"]]
    at.multiselect(key="runs_mode").unselect("dp").run()
    at.text_input(key="runs_text").input("single").run()
    assert at.dataframe[0].value["run_id"].tolist() == [ids["single"]]
    assert at.button(key="delete_runs") is not None  # inside the (closed) popover
    assert at.button(key="rerun_runs").disabled  # nothing selected


def test_cluster_page_cpu_worker(real_client, app_test):
    trio(real_client)
    Heartbeat(real_client.redis, "test-worker", lambda: (None, "idle"),
              devices=[{"name": "cpu", "kind": "cpu", "total_memory_bytes": 1}]).beat()
    at = app_test("views/cluster.py")
    _ok(at)
    workers = at.dataframe[0].value
    assert workers["name"].tolist() == ["test-worker"] and workers["gpus"].tolist() == ["CPU only"]
    assert workers["heartbeat_age_s"].iloc[0] < 10
    assert any("CPU only" in c.value for c in at.caption)
    assert _titles(at) == ["Runs per worker over time"]


def test_cluster_page_gpus(fake_client, app_test):
    gpus = [{"index": i, "name": "NVIDIA H200", "memory_used_bytes": 2 ** 33,
             "memory_total_bytes": 141 * 2 ** 30, "utilization_pct": 87} for i in range(2)]
    fake_client.workers = lambda: [{"name": "gpu-1", "host": "h", "pid": 1, "ts": g.T0,
                                    "state": "busy", "current_run": "r", "devices": [],
                                    "gpus": gpus}]
    at = app_test("views/cluster.py")
    assert not at.exception
    assert _titles(at) == ["GPU memory per device"]
    assert "0: NVIDIA H200, 1: NVIDIA H200" in at.dataframe[0].value["gpus"].iloc[0]


def test_outage_banner_instead_of_traceback(fake_client, app_test, monkeypatch):
    """Redis answers the page's first calls, then goes away inside the live panels."""
    monkeypatch.setenv("REDIS_URL", "redis://:s3cret@db.example:6390/0")
    fake_client.add_run("r1", {"mode": "ddp", "steps": 50}, status="started", group="grp",
                        events=[g.run_started("r1", "ddp", steps=50)])
    fake_client.add_run("r0", {"mode": "dp", "steps": 50}, status="started", group="grp",
                        events=[g.run_started("r0", "dp", steps=50)])

    def down(*a, **k):
        raise redis.exceptions.ConnectionError("Connection refused")

    fake_client.read_events = down
    fake_client.workers = down
    for page in ("views/compare.py", "views/buckets.py", "views/live.py", "views/cluster.py"):
        at = app_test(page)
        assert not at.exception, page
        warning = " ".join(w.value for w in at.warning)
        assert "Redis at `redis://:***@db.example:6390/0` is unreachable — retrying" in warning
        assert "s3cret" not in warning


def test_runs_page_states_the_retention_policy_and_shows_pins(real_client, app_test):
    from ddpviz.workers.retention import RetentionPolicy, publish_policy

    _, ids = trio(real_client)
    at = app_test("views/runs.py")
    _ok(at)
    assert any("no worker has published a policy" in c.value for c in at.caption)
    assert any("wall time also holds the other's turns" in c.value for c in at.caption)  # the tour, issue 33
    publish_policy(real_client.redis, RetentionPolicy(25, 3), "w-test")
    assert real_client.pin(ids["dp"]) and not real_client.pin("no-such-run")
    at = app_test("views/runs.py")
    _ok(at)
    note = next(c.value for c in at.caption if c.value.startswith("Retention:"))
    assert "newest 25 runs" in note and "last 3 days" in note and "w-test" in note
    df = at.dataframe[0].value
    assert df.set_index("run_id")["pinned"].to_dict() == {ids["single"]: False, ids["dp"]: True,
                                                          ids["ddp"]: False, ids["fsdp"]: False}
    assert at.button(key="pin_runs").disabled  # nothing selected


def test_live_page_draws_the_fsdp_unit_timeline_where_ddp_draws_buckets(real_client, app_test):
    _, ids = trio(real_client)
    at = app_test("views/live.py", runs=f"{ids['ddp']},{ids['fsdp']}")
    _ok(at)
    titles = _titles(at)
    assert "Gradient buckets" in titles
    assert "FSDP unit timeline" in titles and "Memory by kind within a step, rank 0" in titles
    captions = " ".join(c.value for c in at.caption)
    # Live keeps DDP's steps 0, 1, 8 and the 8 newest (4-11); by hand, the ranks' mean step times of
    # steps 3-11 have the median 16.455 ms, step 5's own: it is shown; every recorded step was
    # memory-traced, and the caption says so. FSDP's unit timeline shows its latest step
    assert "Step 11: 4 units" in captions and "nothing to overlap" not in captions  # DDP: 3 buckets a step
    assert "Step 5 (instrumented: its time includes the instrument's own work): 3 bucket(s)" in captions
    assert "4 units" in captions and "reshard_after_forward True" in captions
