"""The pages' sentences and tables about DP vs DDP, from hand-worked figures."""

import pytest

from ddpviz.app import explain
from ddpviz.app.frames import compare as fc
from ddpviz.app.window import RunWindow


def _window(rid, mode, status, created, step_s, samples=64, worker="w1", gil=None, **summary):
    """A RunWindow fed hand-made events: 12 steps of `step_s` seconds (no finished summary unless
    `summary` is given)."""
    w = RunWindow(rid)
    w.run = {"run_id": rid, "status": status, "created_at": created, "worker": worker,
             "config": {"mode": mode, "world_size": 2}, "summary": summary or None}
    events = []
    for k in range(12):
        events.append({"type": "step", "rank": 0, "step": k, "samples": samples, "step_time_s": step_s,
                       "samples_per_s": samples / step_s, "forward_s": step_s / 4, "backward_s": step_s / 2,
                       "comm_exposed_s": 0.0, "optimizer_s": step_s / 8, "loss": 1.0})
        for dev, share in (gil or {}).items():
            events.append({"type": "gil", "step": k, "device": dev, "gil_wait_share": share,
                           "gil_wait_s": share * step_s})
    w.ingest(events)
    return w


def test_the_verdict_is_built_from_each_runs_steady_steps_while_they_run():
    # DP 10 ms steps, DDP 8 ms: DDP 1.25x; DP's threads wait 20% of the step, DDP's ranks 0%
    windows = {"a": _window("a", "dp", "started", 1.0, 0.010, gil={"cpu:0": 0.2, "cpu:1": 0.2}),
               "b": _window("b", "ddp", "started", 2.0, 0.008, worker="w2", gil={"cpu:0": 0.0, "cpu:1": 0.0})}
    v, final = explain.pair_verdict(windows)
    assert not final and v.leader == "ddp" and v.ratio == pytest.approx(1.25)
    assert v.interval == pytest.approx((1.25, 1.25))  # every step alike: no spread
    assert "gil" not in v.parts_ms and v.gil_wait_ms == pytest.approx({"dp": 2.0, "ddp": 0.0})  # 20% of 10 ms
    assert explain.verdict_text(v, final).startswith("So far: DDP is ahead: 1.25×")
    assert explain.sequential_note(windows) is None  # two workers


LEVEL_MEAN = {"step_time_s": 0.0128, "forward_s": 0.004, "backward_s": 0.006, "comm_exposed_s": 0.001,
              "optimizer_s": 0.001, "untimed_s": 0.0008}


def level_summary(sps):
    return {"samples_per_s": sps, "step_time_s": 0.0128, "steady_samples_per_s": [sps] * 10,
            "steady_mean_s": LEVEL_MEAN}


def test_a_finished_runs_summary_wins_over_its_events():
    # the events say DDP 1.25x; the summaries (equal samples/s every step) say level
    windows = {"a": _window("a", "dp", "succeeded", 1.0, 0.010, **level_summary(5000.0)),
               "b": _window("b", "ddp", "succeeded", 2.0, 0.008, **level_summary(5000.0))}
    v, final = explain.pair_verdict(windows)
    assert final and v.leader == "level" and v.interval == (1.0, 1.0)
    assert not explain.verdict_text(v, final).startswith("So far")


def test_a_summary_without_the_samples_takes_them_from_the_events():
    # written before the summary carried `steady_samples_per_s`: the events' steps give them
    windows = {"c": _window("c", "dp", "succeeded", 1.0, 0.010, samples_per_s=5000.0, step_time_s=0.0128),
               "d": _window("d", "ddp", "succeeded", 2.0, 0.008, samples_per_s=5050.0, step_time_s=0.0127)}
    v, final = explain.pair_verdict(windows)
    assert final and v.leader == "ddp" and v.ratio == pytest.approx(1.25)


def test_live_says_level_within_noise_on_a_level_pair(fake_client, app_test):
    for rid, mode, t in (("dp1", "dp", 1.0), ("ddp1", "ddp", 2.0)):
        fake_client.add_run(rid, {"mode": mode, "world_size": 2, "steps": 12}, status="succeeded", group="g1",
                            summary=level_summary(5000.0), created_at=t, label=mode.upper())
    at = app_test("views/live.py", runs="dp1,ddp1")
    assert not at.exception
    said = [i.value for i in at.info if "level on this machine, within noise" in i.value]
    assert len(said) == 1 and "What would separate them: more steps" in said[0], [i.value for i in at.info]


def test_the_newest_pair_is_judged_and_one_worker_is_said():
    windows = {"old": _window("old", "dp", "succeeded", 1.0, 0.005),
               "a": _window("a", "dp", "started", 5.0, 0.010),
               "b": _window("b", "ddp", "queued", 6.0, 0.008)}
    assert explain.newest_pair(windows) == ("a", "b")
    assert explain.sequential_note(windows).startswith("DDP waits for DP to finish: one worker")
    assert explain.pair_verdict({"a": windows["a"]}) == (None, False)


def test_a_pair_one_of_which_ended_early_while_the_other_went_on_has_no_verdict():
    """DP canceled at step 110 of a pair in turns, DDP on alone to 400: the verdict set DP's steps in turns against
    DDP's mostly alone and blamed noise (a new user, 2026-12-06). With both 12 steps (DP 10 ms, DDP 8 ms) a
    verdict would be 1.25x; with one ended early there is none, and the page says why."""
    for dp_status, ddp_status, early in (("canceled", "succeeded", "DP"), ("succeeded", "failed", "DDP"),
                                         ("lost", "started", "DP")):
        windows = {"a": _window("a", "dp", dp_status, 1.0, 0.010), "b": _window("b", "ddp", ddp_status, 2.0, 0.008)}
        assert explain.pair_verdict(windows)[0] is None, (dp_status, ddp_status)
        assert explain.waiting_text(windows).startswith(f"No verdict: {early} ended early (")
    both = {"a": _window("a", "dp", "canceled", 1.0, 0.010), "b": _window("b", "ddp", "canceled", 2.0, 0.008)}
    assert explain.pair_verdict(both)[0].ratio == pytest.approx(1.25)  # stopped together (e.g. Ctrl-C on up)
    done = {"a": _window("a", "dp", "succeeded", 1.0, 0.010), "b": _window("b", "ddp", "succeeded", 2.0, 0.008)}
    assert explain.pair_verdict(done)[0].ratio == pytest.approx(1.25)


def test_buffers_frame_marks_ranks_that_start_from_rank_0s_buffers():
    sync = {"type": "sync", "step": 4, "checksums": [[1, 1], [1, 1]], "in_sync": True, "buffers": [
        {"name": "bn.running_mean", "rank": 0, "at_forward_start": [0.5, 0.1], "after_step": [0.7, 0.2]},
        {"name": "bn.running_mean", "rank": 1, "at_forward_start": [0.5, 0.1], "after_step": [0.6, 0.2]},
        {"name": "bn.running_var", "rank": 1, "at_forward_start": [9.0, 3.0], "after_step": [9.1, 3.0]},
        {"name": "bn.running_var", "rank": 0, "at_forward_start": [8.0, 3.0], "after_step": [8.1, 3.0]}]}
    view = fc.RunView(label="DDP", record={"config": {"mode": "ddp", "world_size": 2}},
                      events={"sync": [sync]})
    df = fc.buffers_frame([view]).set_index(["buffer", "rank"])
    assert df.loc[("bn.running_mean", 1), "as_rank0_at_forward"]
    assert not df.loc[("bn.running_var", 1), "as_rank0_at_forward"]
    assert df.loc[("bn.running_mean", 0), "after_step"] == 0.7
    single = fc.RunView(label="S", record={"config": {"mode": "single"}}, events={"sync": [sync]})
    assert fc.buffers_frame([single]).empty


def test_replica_verdicts_say_what_each_mode_checks():
    def view(mode, in_sync):
        return fc.RunView(label=mode, record={"config": {"mode": mode, "world_size": 2}},
                          events={"sync": [{"type": "sync", "step": 1, "in_sync": in_sync}]})
    assert fc.replica_verdict(view("single", None)) == "n/a (one device)"
    assert fc.replica_verdict(view("ddp", False)) == "NO"
    assert fc.replica_verdict(view("dp", True)) == "rebuilt each step; as computed with: yes"
    lost = fc.RunView(label="dp", record={"config": {"mode": "dp", "world_size": 2}}, events={"sync": [
        {"type": "sync", "step": 1, "in_sync": True, "buffers_discarded": 1}]})
    assert fc.replica_verdict(lost) == ("rebuilt each step; as computed with: yes; discards buffer updates "
                                        "made on replicas: 1 buffer(s)")
    assert fc.replicas_in_sync(view("single", None)) is None
