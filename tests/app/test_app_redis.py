"""Pages against a real Redis through the real `DdpvizClient` (no worker: runs stay queued
unless a test plays a recorded run into the stream)."""

import json
import re

from recorded import play as _play


def test_launch_pair_through_redis(real_client, app_test):
    at = app_test()
    assert not at.exception and not at.error
    at.number_input(key="cfg_steps").set_value(3)
    at.button(key="launch_pair").click().run()
    assert not at.exception
    dp_id, ddp_id = at.session_state["launched"]
    runs = {r["run_id"]: r for r in real_client.list_runs()}
    assert runs[dp_id]["config"]["mode"] == "dp" and runs[ddp_id]["config"]["mode"] == "ddp"
    assert runs[dp_id]["status"] == "queued" and runs[dp_id]["group"] == runs[ddp_id]["group"]


def test_world_size_zero_reaches_no_redis(real_client, app_test):
    at = app_test()
    at.segmented_control(key="launch_what").set_value("one").run()
    at.number_input(key="cfg_world_size").set_value(0)
    at.button(key="launch_one").click().run()
    assert "world_size must be >= 1" in at.error[0].value
    assert real_client.list_runs() == []


def test_live_and_runs_pages_on_recorded_runs(real_client, app_test):
    dp_id, ddp_id = real_client.submit_pair({"world_size": 2, "steps": 12, "width": 256,
                                             "bucket_cap_mb": 0.1})
    _play(real_client, dp_id, "real_dp_mlp_ws2.jsonl")
    _play(real_client, ddp_id, "real_ddp_mlp_ws2.jsonl")
    at = app_test("views/live.py")
    assert not at.exception and not at.error
    assert at.multiselect(key="live_pick").value == [dp_id, ddp_id]
    specs = [json.loads(c.proto.spec) for c in at.get("vega_lite_chart")]
    titles = {s["title"]["text"] for s in specs}
    assert {"Throughput per step", "Step time split", "Memory within a step: DP",
            "Gradient buckets", "DP phases"} <= titles
    # the step shown (the typical one: step 5, `test_app_analysis_pages`), and that it was instrumented
    assert re.search(r"Step 5( \([^)]*\))?: 3 bucket\(s\)", " ".join(c.value for c in at.caption))
    assert not at.session_state["live_polling"]

    at = app_test("views/runs.py")
    assert not at.exception and not at.error
    df = at.dataframe[0].value
    assert set(df["run_id"]) == {dp_id, ddp_id} and set(df["status"]) == {"succeeded"}


def test_cancel_queued_run_from_live(real_client, app_test):
    rid = real_client.submit({"mode": "ddp", "steps": 5})
    at = app_test("views/live.py", runs=rid)
    assert not at.exception
    at.button(key=f"cancel_{rid}").click().run()
    assert real_client.get_run(rid)["status"] == "canceled"


def test_unreachable_redis_banner_with_real_client(app_test, monkeypatch):
    import ddpviz.app.connection
    from ddpviz import app  # noqa: E402

    monkeypatch.setenv("REDIS_URL", "redis://:hunter2@127.0.0.1:1/0")  # nothing listens on port 1
    app.connection._client.clear()
    for page in (None, "views/live.py", "views/runs.py"):
        at = app_test(page)
        assert not at.exception
        banner = at.error[0].value
        assert "Cannot reach Redis at `redis://:***@127.0.0.1:1/0`" in banner
        assert "hunter2" not in banner
