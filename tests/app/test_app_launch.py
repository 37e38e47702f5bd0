"""The Launch page (issue 21, Launch): the primary button is the DP/DDP pair the README starts with,
the form shows only the fields the chosen action uses, the Tiny preset is the former defaults, and
the banner names each run's mode and is gone after the reader visits another page.

AppTest on the in-memory client (tests/app/conftest.py); the references are the README's text, the
former defaults as the README states them and the modes the client stored for each run.
"""

from pathlib import Path

from ddpviz.app import form, navigation

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
FSDP_ONLY = {"reshard_after_forward", "fsdp_param_dtype", "fsdp_reduce_dtype"}
# README "What to expect on a 2-core laptop": "The former default Launch pair (mlp 128×3, batch 64,
# 25 MiB buckets)"
FORMER_DEFAULTS = {"model": "mlp", "width": 128, "depth": 3, "global_batch_size": 64, "bucket_cap_mb": 25.0}


def _field_keys(at) -> set[str]:
    """The RunConfig fields the form shows (field_widget keys them ``cfg_<field>``)."""
    widgets = [*at.selectbox, *at.number_input, *at.checkbox]
    return {w.key[len("cfg_"):] for w in widgets if w.key and w.key.startswith("cfg_")}


def _launch_buttons(at) -> list:
    return [b for b in at.button if b.key and b.key.startswith("launch_")]


def test_the_primary_button_launches_the_pair_the_readme_names(fake_client, app_test):
    at = app_test()
    assert not at.exception
    assert at.segmented_control(key="launch_what").value == "pair"
    (button,) = _launch_buttons(at)  # one button, the primary one
    assert button.proto.type == "primary" and button.key == "launch_pair"
    assert f"press **{button.label}**" in README  # "make demo" tells a new user to press this one
    button.click().run()
    assert not at.exception
    assert [c["mode"] for c in fake_client.submitted] == ["dp", "ddp"]
    assert len({r["group"] for r in fake_client.runs.values()}) == 1


def test_the_form_hides_the_fields_the_action_ignores(fake_client, app_test):
    at = app_test()
    every = set(form.form_fields())
    assert _field_keys(at) == every - {"mode"} - FSDP_ONLY  # the pair sets the mode; DP and DDP take no FSDP field
    at.segmented_control(key="launch_what").set_value("trio").run()
    assert _field_keys(at) == every - {"mode"}  # the set sets the mode; its FSDP run takes the FSDP fields
    assert [b.label for b in _launch_buttons(at)] == ["Launch single, DP, DDP and FSDP"]
    at.segmented_control(key="launch_what").set_value("one").run()
    assert _field_keys(at) == every
    (button,) = _launch_buttons(at)
    assert button.proto.type == "primary" and button.label == "Launch one run"
    at.selectbox(key="cfg_mode").set_value("dp")
    button.click().run()
    assert not at.exception and [c["mode"] for c in fake_client.submitted] == ["dp"]


def test_the_tiny_preset_fills_the_form_with_the_former_defaults(fake_client, app_test):
    at = app_test()
    at.number_input(key="cfg_width").set_value(7)
    at.number_input(key="cfg_steps").set_value(11)
    at.segmented_control(key="launch_preset").set_value("tiny").run()
    assert not at.exception
    shown = {f: at.number_input(key=f"cfg_{f}").value for f in ("width", "depth", "global_batch_size",
                                                                 "bucket_cap_mb", "steps")}
    assert shown == {**{k: v for k, v in FORMER_DEFAULTS.items() if k != "model"},
                     "steps": form.defaults()["steps"]}  # every field refilled, not only the preset's
    assert at.selectbox(key="cfg_model").value == "mlp"
    at.button(key="launch_pair").click().run()
    for config in fake_client.submitted:
        assert {k: config[k] for k in FORMER_DEFAULTS} == FORMER_DEFAULTS
    at.segmented_control(key="launch_preset").set_value("default").run()
    assert (at.number_input(key="cfg_width").value, at.number_input(key="cfg_bucket_cap_mb").value) == (64, 25.0)
    at.segmented_control(key="launch_preset").set_value("overlap").run()
    assert (at.number_input(key="cfg_width").value, at.number_input(key="cfg_bucket_cap_mb").value) == (64, 0.1)


def test_the_banner_names_each_runs_mode_and_clears_after_another_page(fake_client, app_test):
    at = app_test()
    at.segmented_control(key="launch_what").set_value("trio").run()
    at.button(key="launch_trio").click().run()
    assert not at.exception
    names = {"single": "single", "dp": "DP", "ddp": "DDP", "fsdp": "FSDP"}
    by_mode = {r["config"]["mode"]: run_id for run_id, r in fake_client.runs.items()}
    banner = at.info[0].value
    assert banner == "Submitted 4 runs: " + ", ".join(f"`{by_mode[m]}` {names[m]}" for m in names)
    assert at.info[1].value.startswith("Waiting for a worker: ")  # queued: no worker took them yet
    assert [p.proto.label for p in at.get("page_link")] == ["Watch them live", "Compare them"]
    live = at.get("page_link")[0].proto.query_string  # Live opens on the set's DP and DDP (was DDP and FSDP)
    assert live == f"runs={by_mode['dp']}%2C{by_mode['ddp']}", live
    at.segmented_control(key="launch_what").set_value("pair").run()  # a rerun of the page keeps it
    assert at.info[0].value == banner
    at.switch_page("views/runs.py").run()
    at.switch_page("views/launch.py").run()
    assert not at.exception
    assert not at.info and not at.get("page_link")


def test_a_run_refused_by_its_workers_pre_flight_shows_on_launch_not_a_success(fake_client, app_test):
    """The tour (issue 33): PowerSGD on gloo with two buckets said "Launched 2 runs" while the
    worker had refused both; the refusal showed on Live only."""
    at = app_test()
    at.button(key="launch_pair").click().run()
    dp_id, ddp_id = at.session_state["launched"]
    refusal = "pre-flight: comm_hook powersgd on gloo hangs with 2 buckets (PyTorch's own); use bucket_cap_mb >= 1"
    fake_client.runs[ddp_id].update(status="failed", error={"rank": None, "exception": refusal, "traceback": None})
    fake_client.runs[dp_id].update(status="failed", error={"rank": None, "exception": "not started: its DDP "
                                                           f"partner was refused in pre-flight ({refusal})",
                                                           "traceback": None})
    at.run()
    assert not at.exception and not at.success
    (error,) = [e.value for e in at.error]
    assert f"`{ddp_id}` DDP failed: {refusal}" in error and error.count(refusal) == 1  # said once
    assert f"`{dp_id}` DP failed: not started: its DDP partner was refused in pre-flight (DDP's reason)" in error
    fake_client.runs[ddp_id].update(status="started", error=None, started=None)
    fake_client.runs[dp_id].update(status="succeeded", error=None)
    at.run()
    assert not at.error and not at.success
    assert f"pre-flight checks under way for `{ddp_id}` DDP" in at.info[1].value  # no run_started yet
    fake_client.runs[ddp_id]["started"] = {"type": "run_started"}  # the engine's, after its checks passed
    at.run()
    assert not at.error and at.success[0].value.startswith("Every run passed its pre-flight checks")


def test_arrived_tells_a_rerun_from_a_page_change():
    state = {"launched": {"a": "dp"}}
    navigation.note_page(state, "")  # first run: an arrival
    assert navigation.arrived(state)
    navigation.note_page(state, "")  # the same page again: a rerun
    assert not navigation.arrived(state)
    navigation.forget_on_arrival(state, ("launched",))
    assert state["launched"] == {"a": "dp"}
    navigation.note_page(state, "live")
    navigation.note_page(state, "")
    navigation.forget_on_arrival(state, ("launched",))
    assert "launched" not in state


def test_the_status_line_stops_polling_once_every_run_is_settled(fake_client, app_test):
    """The status line read Redis every 2 s for as long as the page stayed open, runs long finished
    included. It polls while a run may still change (queued, started) and stops once each is
    succeeded, failed, canceled or lost; the reference is the client's stored status."""
    at = app_test()
    at.button(key="launch_pair").click().run()
    dp_id, ddp_id = at.session_state["launched"]
    assert at.session_state["launch_status_polling"] is True  # queued
    fake_client.runs[dp_id].update(status="succeeded")
    fake_client.runs[ddp_id].update(status="started")
    at.run()
    assert at.session_state["launch_status_polling"] is True  # DDP still training
    fake_client.runs[ddp_id].update(status="succeeded", started=True)
    at.run()
    assert not at.exception and at.session_state["launch_status_polling"] is False
    assert at.success[0].value.startswith("Finished: ") and at.success[0].value.endswith(
        "all succeeded. Live and Compare show them; the Runs page keeps them.")
    fake_client.runs[ddp_id].update(status="lost")
    at.run()
    assert at.session_state["launch_status_polling"] is False and not at.success


def test_a_run_deleted_while_the_page_polls_raises_nothing_and_keeps_polling(fake_client, app_test):
    """`get_run` returns None for a run no longer stored (deleted from the Runs page): the status line's
    check must not raise on it (it did: `None.get`) and keeps polling."""
    at = app_test()
    at.button(key="launch_pair").click().run()
    dp_id, ddp_id = at.session_state["launched"]
    fake_client.runs[ddp_id].update(status="succeeded")
    del fake_client.runs[dp_id]
    at.run()
    assert not at.exception and at.session_state["launch_status_polling"] is True


def test_with_no_worker_alive_launch_and_live_say_so(fake_client, app_test):
    """`ddpviz up --workers 0`: a run waited at "Waiting for a worker" and "queued" with nothing saying that none
    was alive (a new user, 2026-12-06)."""
    from ddpviz.workers.heartbeat import NO_WORKER

    fake_client.live_workers = []
    at = app_test()
    at.segmented_control(key="launch_what").set_value("pair").run()
    at.button(key="launch_pair").click().run()
    assert not at.exception
    assert any(NO_WORKER in w.value for w in at.warning), [w.value for w in at.warning]
    run_id = next(iter(fake_client.runs))
    live = app_test("views/live.py", runs=run_id)
    assert any("No worker is serving the queue" in w.value for w in live.warning)
    fake_client.live_workers = [{"name": "w"}]
    live = app_test("views/live.py", runs=run_id)
    assert not any("No worker is serving the queue" in w.value for w in live.warning)
