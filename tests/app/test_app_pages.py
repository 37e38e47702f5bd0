"""Each page renders without exceptions (AppTest, in-memory client), and the form validates."""

import json

import eventgen as g


def _texts(at) -> str:
    parts = [e.value for e in at.error] + [e.value for e in at.markdown] + \
            [e.value for e in at.caption] + [e.value for e in at.info] + \
            [e.value for e in at.warning] + [e.value for e in at.success]
    return "\n".join(str(p) for p in parts)


def _add_pair(client, steps=4, status="succeeded"):
    events_dp, events_ddp = g.full_run("dp1", "dp", steps), g.full_run("ddp1", "ddp", steps)
    cfg = {"mode": "dp", "world_size": 2, "steps": steps}
    client.add_run("dp1", cfg, status=status, events=events_dp, group="grp", created_at=g.T0,
                   label="DP")
    client.add_run("ddp1", {**cfg, "mode": "ddp"}, status=status, events=events_ddp,
                   group="grp", created_at=g.T0 + 1, label="DDP",
                   summary={"samples_per_s": 3000.0, "steps_done": steps})


def test_launch_page_renders_with_defaults(fake_client, app_test):
    at = app_test()
    assert not at.exception
    assert at.title[0].value == "Launch a run"
    assert at.number_input(key="cfg_world_size").value == 2
    assert at.number_input(key="cfg_bucket_cap_mb").value == 25.0  # PyTorch's default, the lab's since issue 33
    at.segmented_control(key="launch_what").set_value("one").run()
    assert at.selectbox(key="cfg_mode").value == "ddp"


def test_world_size_zero_shows_error_and_submits_nothing(fake_client, app_test):
    at = app_test()
    at.number_input(key="cfg_world_size").set_value(0)
    at.button(key="launch_pair").click().run()
    assert not at.exception
    errors = "\n".join(e.value for e in at.error)
    assert "world_size" in errors and "must be >= 1" in errors
    assert fake_client.submitted == [] and fake_client.runs == {}


def test_cross_field_error_names_field(fake_client, app_test):
    at = app_test()
    at.number_input(key="cfg_global_batch_size").set_value(63)
    at.button(key="launch_pair").click().run()
    errors = "\n".join(e.value for e in at.error)
    assert "**global_batch_size**" in errors and "divisible" in errors
    assert fake_client.submitted == []


def test_launch_one_and_pair(fake_client, app_test):
    at = app_test()
    at.segmented_control(key="launch_what").set_value("one").run()
    at.number_input(key="cfg_steps").set_value(5)
    at.text_input(key="cfg_label").input("mine")
    at.button(key="launch_one").click().run()
    assert not at.exception and len(fake_client.submitted) == 1
    assert fake_client.submitted[0]["steps"] == 5
    (rid,) = at.session_state["launched"]
    assert fake_client.runs[rid]["label"] == "mine"
    at.segmented_control(key="launch_what").set_value("pair").run()
    at.button(key="launch_pair").click().run()
    assert [c["mode"] for c in fake_client.submitted[1:]] == ["dp", "ddp"]
    assert len(at.session_state["live_runs"]) == 2
    assert "Submitted 2 runs" in _texts(at)


def test_redis_down_shows_banner_without_password(fake_client, app_test, monkeypatch):
    fake_client.reachable = False
    monkeypatch.setenv("REDIS_URL", "redis://:s3cret@db.example:6390/2")
    for page in (None, "views/live.py", "views/runs.py"):
        at = app_test(page)
        assert not at.exception
        banner = at.error[0].value
        assert "redis://:***@db.example:6390/2" in banner and "s3cret" not in banner


def test_live_page_empty(fake_client, app_test):
    at = app_test("views/live.py")
    assert not at.exception
    assert "No runs yet" in _texts(at)


def test_live_page_defaults_to_latest_pair_and_draws_charts(fake_client, app_test):
    _add_pair(fake_client)
    at = app_test("views/live.py")
    assert not at.exception
    assert at.multiselect(key="live_pick").value == ["dp1", "ddp1"]
    specs = [json.loads(c.proto.spec) for c in at.get("vega_lite_chart")]
    titles = sorted(s["title"]["text"] for s in specs)
    # throughput, split, memory (tensors over phases, process) x2, DP phases + volume, DDP buckets
    # + volume (no eval: no accuracy)
    assert titles == sorted(["Throughput per step", "Step time split",
                             "Memory within a step: DP", "Memory within a step: DDP",
                             *["The whole process (RSS)"] * 2,  # CPU runs: RSS only, no GPU in the title
                             "DP phases", "Bytes moved per device",
                             "Gradient buckets", "Bytes moved per device"])
    assert "step 4 / 4" in str([p.proto.text for p in at.get("progress")])
    assert not at.session_state["live_polling"]  # both finished: polling stopped


def test_a_single_dp_ddp_fsdp_set_opens_on_its_dp_ddp_pair():
    """The set's ids sort FSDP ("a...") and single before DDP ("z..."): Live still opens on DP and DDP, the
    pair the verdict compares (before, it took DP and the first id: FSDP)."""
    from ddpviz.app.runsets import latest_pair

    runs = [dict(run_id=i, group="g", created_at=1.0, config=dict(mode=m))
            for i, m in (("a-fsdp", "fsdp"), ("b-single", "single"), ("z-ddp", "ddp"), ("c-dp", "dp"))]
    assert latest_pair(runs) == ["c-dp", "z-ddp"]
    assert latest_pair(runs[:2]) == ["a-fsdp", "b-single"]
    assert latest_pair([dict(run_id="x", created_at=2.0, config=dict(mode="ddp"))] + runs) == ["x"]


def test_the_run_card_shows_what_ddpviz_could_not_record_once(fake_client, app_test):
    """A run's `log` warnings (a rank that left its record open, a compiled forward) show on its card, each
    once; DP's buffer warning and the lost-event count keep their own boxes, info-level logs none."""
    events = g.full_run("ddp1", "ddp", 4)
    said = "rank 1 (pid 7) ended without closing its record (os._exit, or a kill)"
    events += [{"type": "log", "run_id": "ddp1", "ts": g.T0 + 5, "rank": r, "level": "warning", "message": said}
               for r in (0, 1)]
    events.append({"type": "log", "run_id": "ddp1", "ts": g.T0 + 5, "level": "info", "message": "tuned"})
    fake_client.add_run("ddp1", {"mode": "ddp", "world_size": 2, "steps": 4}, status="succeeded", events=events,
                        created_at=g.T0, label="DDP")
    at = app_test("views/live.py")
    assert not at.exception
    boxes = [w.value for w in at.warning if w.value.startswith("From ddpviz in the run")]
    assert boxes == [f"From ddpviz in the run: {said}"]


def test_live_page_draws_memory_over_the_whole_run_beside_the_step(fake_client, app_test):
    events = g.full_run("ddp1", "ddp", 4)
    for rank in range(2):  # 20 readings a second for 2 s, rank r holding (r + 1) * 100 MiB
        events.append({"type": "memory_readings", "run_id": "ddp1", "ts": g.T0 + 2, "rank": rank,
                       "device": f"cpu:{rank}", "reading_ts": [g.T0 + 0.05 * i for i in range(40)],
                       "bytes": {"process": [(rank + 1) * 100 * 2**20] * 40}, "interval_s": 0.05})
    fake_client.add_run("ddp1", {"mode": "ddp", "world_size": 2, "steps": 4}, status="succeeded",
                        events=events, created_at=g.T0, label="DDP")
    at = app_test("views/live.py", runs="ddp1")
    assert not at.exception
    import pyarrow as pa

    charts = {json.loads(c.proto.spec)["title"]["text"]: c.proto for c in at.get("vega_lite_chart")}
    assert "Memory within a step: DDP" in charts
    proto = charts["Memory over the run: process RSS (psutil)"]
    data = [r for d in proto.datasets
            for r in pa.ipc.open_stream(d.data.data).read_all().to_pandas().to_dict("records")]
    data = list({(r["device"], r["t_s"]): r for r in data if "device" in r}.values())  # the band and the
    # line share their rows; the axis extent's two rows have no device
    means = {r["device"]: r["mib"] for r in data}
    assert means == {"cpu:0": 100.0, "cpu:1": 200.0} and sum(r["readings"] for r in data) == 80


def test_live_page_shows_full_error(fake_client, app_test):
    err = {"rank": 1, "exception": "RuntimeError: boom", "traceback": "Traceback (most recent)\n"
           "  File \"x.py\", line 1\nRuntimeError: boom"}
    fake_client.add_run("bad", {"mode": "ddp"}, status="failed", error=err,
                        events=[g.run_started("bad", "ddp"), g.run_finished("bad", 0, "failed", err)])
    at = app_test("views/live.py", runs="bad")
    assert not at.exception
    assert "Run failed (rank 1): RuntimeError: boom" in at.error[0].value
    assert at.code[0].value == err["traceback"]
    # a run that ended before its first step is waited for no more (the tour, issue 33: a refused pair)
    assert not [i.value for i in at.info if i.value.startswith("Waiting for")]
    card = next(c.value for c in at.caption if c.value.startswith("`bad`"))
    assert "bucket cap 25 MiB · overlap setting on" in card
    assert "The run ended (failed) before the first step came." in [c.value for c in at.caption]


def test_a_refused_pair_says_neither_trained_and_waits_for_nothing(fake_client, app_test):
    err = {"rank": None, "exception": "pre-flight: comm_hook powersgd on gloo with 2 buckets hangs", "traceback": ""}
    for rid, mode in (("p-dp", "dp"), ("p-ddp", "ddp")):
        fake_client.add_run(rid, {"mode": mode}, status="failed", error=err, group="g1",
                            events=[g.run_finished(rid, 0, "failed", err)])
    fake_client.runs["p-dp"]["pair"] = {"runs": ["p-dp", "p-ddp"], "turn_steps": 10, "why": "in turns of 10 steps"}
    at = app_test("views/live.py", runs="p-dp,p-ddp")
    assert not at.exception
    texts = [c.value for c in at.caption] + [i.value for i in at.info]
    assert not [t for t in texts if t.startswith("Waiting for") or "trained at once" in t], texts
    assert "Neither run trained to its end (DP failed, DDP failed): each run's status above says why." in texts
    assert any(t.startswith("No verdict: the runs ended (DP failed, DDP failed)") for t in texts), texts


def test_live_page_shows_a_canceled_run_as_canceled_not_failed(fake_client, app_test):
    err = {"rank": None, "exception": "Canceled: canceled by user", "traceback": ""}
    fake_client.add_run("stopped", {"mode": "dp"}, status="canceled", error=err,
                        events=[g.run_started("stopped", "dp"), g.run_finished("stopped", 0, "canceled", err)])
    at = app_test("views/live.py", runs="stopped")
    assert not at.exception
    assert not at.error
    assert at.info[0].value == "Run canceled: canceled by user"  # "canceled" was said four times (a new user)
    card = next(c.value for c in at.caption if c.value.startswith("`stopped`"))
    assert "global batch" in card and "bucket cap" not in card and "overlap" not in card  # DP has neither


def test_live_page_running_run_keeps_polling(fake_client, app_test):
    events = [g.run_started("run", "ddp", steps=50)] + g.ddp_step("run", 0)
    fake_client.add_run("run", {"mode": "ddp", "steps": 50}, status="started", events=events)
    at = app_test("views/live.py", runs="run")
    assert not at.exception
    assert at.session_state["live_polling"]
    assert at.button(key="cancel_run").value is False
    at.button(key="cancel_run").click().run()
    assert fake_client.canceled == ["run"]


def test_runs_page_lists_runs(fake_client, app_test):
    _add_pair(fake_client, status="succeeded")
    fake_client.add_run("q1", {"mode": "ddp"}, status="queued", created_at=g.T0 + 5)
    at = app_test("views/runs.py")
    assert not at.exception
    df = at.dataframe[0].value
    assert df["run_id"].tolist() == ["q1", "ddp1", "dp1"]
    assert df.loc[df["run_id"] == "ddp1", "samples_per_s"].iloc[0] == 3000.0
    assert at.button(key="cancel_runs").disabled  # nothing selected yet
    assert "The newest DP and DDP pair: DP `dp1`, DDP `ddp1`." in [c.value for c in at.caption]  # the verdict's pair


def test_live_page_unknown_run_id(fake_client, app_test):
    _add_pair(fake_client)
    at = app_test("views/live.py", runs="nope,dp1")
    assert not at.exception
    assert "No such run: `nope`" in at.warning[0].value
    assert at.multiselect(key="live_pick").value == ["dp1"]
    # only unknown ids, with runs stored: the warning, then the picker, not "No runs yet" (a new user, 2026-12-06)
    at = app_test("views/live.py", runs="deadbeef")
    assert not at.exception and "No such run: `deadbeef`" in at.warning[0].value
    assert "No runs yet" not in str([i.value for i in at.info]) and "Pick one or two runs" in at.info[0].value


def test_live_names_the_steps_whose_all_reduce_was_timed_when_the_typical_one_has_none(fake_client, app_test):
    """bucket_timing=recorder: ordinary steps have ready times, no all-reduce span; the sampled
    (traced) steps 0, 1 and 11 have both. Live opens on an ordinary step and says where the spans are
    (the tour, issue 33: a first-time user never saw a measured all-reduce)."""
    events = [g.run_started("rec", "ddp", steps=12)]
    for step in range(12):
        sampled = step in (0, 1, 11)
        for e in g.ddp_step("rec", step, buckets=1):
            if e["type"] == "step" and sampled:
                e["memory_traced"] = True
            if e["type"] == "bucket":
                e.update(sampled=sampled, comm_start_s=e["comm_start_s"] if sampled else None,
                         comm_end_s=e["comm_end_s"] if sampled else None)
            events.append(e)
    events.append(g.run_finished("rec", 12))
    fake_client.add_run("rec", {"mode": "ddp", "steps": 12}, status="succeeded", events=events)
    at = app_test("views/live.py", runs="rec")
    assert not at.exception
    card = next(c.value for c in at.caption if c.value.startswith("`rec`"))
    assert card.endswith("overlap setting on (one bucket: nothing to overlap)"), card  # one bucket a step
    caption = next(c.value for c in at.caption if "bucket(s)" in c.value)
    assert "typical" in caption and "all-reduce algbw not measured on this step" in caption
    assert "All-reduce spans were measured on the sampled steps (0, 1, 11)" in caption, caption


def test_the_verdict_box_says_who_leads_and_folds_the_parts_that_decided_it(fake_client, app_test):
    """The box holds the headline (who is ahead, by how much, the interval); the gap's parts, each in ms, and
    what was not measured sit under a fold (a reviewer's tour: ~15 lines of figures in one box)."""
    from ddpviz.app.panels import VERDICT_WHY

    _add_pair(fake_client, steps=30)
    at = app_test("views/live.py")
    assert not at.exception
    boxes = [e.value for e in at.success] + [e.value for e in at.info]
    verdict, = [b for b in boxes if "interval" in b and "samples/s" in b]
    assert " ahead" in verdict or "level" in verdict
    assert "not measured:" not in verdict and " ms;" not in verdict
    fold, = [e for e in at.expander if e.label == VERDICT_WHY]
    why = " ".join(m.value for m in fold.markdown)
    assert "mean step is" in why and "not measured:" in why and " ms" in why


def test_the_runs_page_shows_a_selected_failed_runs_error(fake_client, app_test):
    # Launch says "the Runs page keeps the whole error": it showed none for a selected failed run (a new user)
    err = {"stage": "training", "rank": 1, "step": 5, "exception": "InjectedFault: injected fault: rank 1 raised at "
           "step 5", "traceback": "Traceback (most recent call last):\n  boom"}
    fake_client.add_run("bad", {"mode": "ddp"}, status="failed", error=err)
    at = app_test("views/runs.py")
    assert not at.error
    at.session_state["runs_table"] = {"selection": {"rows": [0], "columns": []}}
    at.run()
    assert not at.exception
    assert "Run failed (rank 1 at step 5): InjectedFault: injected fault: rank 1 raised at step 5" in at.error[0].value
    assert at.code[0].value == err["traceback"]


def test_the_runs_pages_refresh_reads_runs_submitted_since(fake_client, app_test):
    _add_pair(fake_client, status="succeeded")
    at = app_test("views/runs.py")
    fake_client.add_run("later", {"mode": "ddp"}, status="queued", created_at=g.T0 + 9)  # from the CLI, say
    at.button(key="runs_refresh").click().run()
    assert at.dataframe[0].value["run_id"].tolist()[0] == "later"
