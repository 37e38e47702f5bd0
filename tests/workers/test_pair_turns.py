"""The app's DP+DDP pair trains at once, taking turns of blocks of steps (`workers.jobs.pair`).

The reference for "taking turns" is the stored step events' own clock: each step event's
`start_ts` (unix seconds) and `step_time_s`. A pair run one after the other has all of one run's
blocks before the other's; in turns, the owners of the blocks, in time order, alternate, the order
swapped each round (DP, DDP, then DDP, DP), and no block overlaps another.
"""

from __future__ import annotations

import time

import pytest
from wtools import TINY, wait_for, worker_process

from ddpviz.app import explain
from ddpviz.app.window import RunWindow
from ddpviz.engine.measure.turns import TurnController, TurnGate, pair_turn_steps
from ddpviz.workers.client import DdpvizClient
from ddpviz.workers.jobs.pair import check_pair_ids
from ddpviz.workers.jobs.run import JobRefused
from ddpviz.workers.keys import pair_job_id

PAIR = {**TINY, "world_size": 2, "device": "cpu"}


@pytest.fixture
def client(redis_client):
    return DdpvizClient(redis=redis_client)


def _steps(client, run_id):
    events, _ = client.read_events(run_id, count=100_000)
    return [e for e in events if e["type"] == "step" and e.get("rank", 0) == 0], events


def _blocks(steps, block):
    """[(start_ts, end_ts)] of each block of `block` steps, from the step events' own clocks."""
    out = []
    for k in range(0, len(steps), block):
        chunk = [e for e in steps if k <= e["step"] < k + block]
        out.append((min(e["start_ts"] for e in chunk), max(e["start_ts"] + e["step_time_s"] for e in chunk)))
    return out


def _window(client, run_id):
    w = RunWindow(run_id)
    w.run = client.get_run(run_id)
    w.ingest(client.read_events(run_id, count=100_000)[0])
    return w


def _ended(client, *run_ids):
    return all(client.get_run(r)["status"] not in ("queued", "started") for r in run_ids)


# -- the rule and the payload ------------------------------------------------------------------

@pytest.mark.parametrize("steps, turn", [(20, 10), (100, 10), (12, 6), (10, 5), (4, 2), (38, 19),
                                         (46, 2), (7, None), (5, None), (1, None), (47, None)])
def test_turn_size_is_ten_else_the_largest_divisor_giving_two_turns(steps, turn):
    assert pair_turn_steps(steps)[0] == turn
    if turn is None:
        assert f"steps={steps}" in pair_turn_steps(steps)[1]


def test_a_multi_host_pair_does_not_take_turns_and_says_why():
    from ddpviz.workers.jobs.pair import pair_plan

    plan = pair_plan("a1", "b2", 20, nnodes=2)
    assert plan["turn_steps"] is None and "nnodes=2" in plan["why"] and plan["job_id"] == "a1-turns-b2"


def test_bad_input_names_the_field():
    with pytest.raises(ValueError, match="steps must be an integer >= 1"):
        pair_turn_steps(0)
    with pytest.raises(JobRefused, match="ddp_run_id must be"):
        check_pair_ids(("abc", "../x"), {})
    with pytest.raises(JobRefused, match=r"args must be \[dp_run_id, ddp_run_id\]"):
        check_pair_ids(("abc",), {})
    with pytest.raises(JobRefused, match="must differ"):
        check_pair_ids(("abc", "abc"), {})


def test_the_controller_drops_a_side_that_ends_and_the_other_trains_on():
    # two one-rank sides in threads; side "b" leaves after its first block, "a" does all 3
    ctl = TurnController({"a": 1, "b": 1}, 2, timeout_s=20)
    done = {"a": [], "b": []}

    def side(name, blocks):
        gate = TurnGate(ctl.spec, name, 0)
        for step in range(6):
            if step // 2 >= blocks:
                gate.close()
                return
            gate.at_step(step)
            done[name].append(step)
        gate.at_end()

    import threading

    threads = {n: threading.Thread(target=side, args=(n, b)) for n, b in (("a", 3), ("b", 1))}
    for t in threads.values():
        t.start()
    ctl.run(["a", "b", "b", "a", "a", "b"], side_alive=lambda n: threads[n].is_alive())
    for t in threads.values():
        t.join(10)
    assert done == {"a": list(range(6)), "b": [0, 1]}
    assert [s for s, _, _ in ctl.block_log] == ["a", "a", "a"] and set(ctl.dropped) == {"b"}  # b left inside its turn


def test_a_worker_running_a_pair_revives_both_runs_if_they_were_judged_lost(redis_client):
    # the worker's heartbeat names a pair's runs "dp,ddp" (workers.worker._current): both are its own
    from ddpviz.workers.liveness import LostRunMonitor
    from ddpviz.workers.store import RunStatus, RunStore, make_error

    store = RunStore(redis_client)
    for r in ("a1", "b2"):
        store.create(r, {**PAIR, "mode": "dp"})
        assert store.mark_started(r, "w1") and store.mark_lost(r, make_error("WorkerLost: test"))
    LostRunMonitor(store, "w1", lambda: "a1,b2").sweep()
    assert [store.status(r) for r in ("a1", "b2")] == [RunStatus.STARTED, RunStatus.STARTED]


def test_rqs_hooks_settle_both_runs_of_a_pair_job(client):
    # the pair's job stopped (RQ's stop-job command), or its work-horse killed: both runs end
    from types import SimpleNamespace

    from ddpviz.workers.jobs.run import on_horse_killed, on_job_stopped

    for hook, status in ((lambda job: on_job_stopped(job, job.connection), "canceled"),
                         (lambda job: on_horse_killed(job, 123, 9, None), "failed")):
        dp, ddp = client.submit_pair({**PAIR, "steps": 20})
        for r in (dp, ddp):
            assert client.store.mark_started(r, "w1")
        hook(SimpleNamespace(id=pair_job_id(dp, ddp), connection=client.redis))
        assert [client.get_run(r)["status"] for r in (dp, ddp)] == [status, status]


# -- a real pair through a real worker ---------------------------------------------------------

@pytest.mark.slow
def test_a_pair_trains_at_once_taking_rotated_turns_and_both_succeed(client, redis_url, tmp_path):
    dp, ddp = client.submit_pair({**PAIR, "steps": 20}, label="turns")
    plan = client.get_run(dp)["pair"]
    assert plan == client.get_run(ddp)["pair"] and plan["turn_steps"] == 10 and plan["runs"] == [dp, ddp]
    assert client.queue.job_ids == [pair_job_id(dp, ddp)]  # one job: one worker runs both at once
    assert "will train at once" in explain.sequential_note({dp: _window(client, dp), ddp: _window(client, ddp)})
    t0 = time.monotonic()
    with worker_process(redis_url, burst=True, name="wp1", log_path=tmp_path / "w.log") as proc:
        assert proc.wait(60) == 0
    wall_s = time.monotonic() - t0
    log = (tmp_path / "w.log").read_text()[-3000:]
    recs = {r: client.get_run(r) for r in (dp, ddp)}
    for r, rec in recs.items():
        assert rec["status"] == "succeeded", (rec["error"], log)
        assert rec["worker"] == "wp1" and rec["summary"]["steps_done"] == 20
    blocks = []
    for r in (dp, ddp):
        steps, events = _steps(client, r)
        assert [e["step"] for e in steps] == list(range(20))
        said = [e["message"] for e in events if e["type"] == "log"]
        assert any("at once" in m and "in turns of 10 steps" in m for m in said), said
        blocks += [(start, end, r) for start, end in _blocks(steps, 10)]
    blocks.sort()
    assert [r for _, _, r in blocks] == [dp, ddp, ddp, dp], blocks  # rotated: DP first, then DDP first
    for (_, end, _), (start, _, _) in zip(blocks, blocks[1:]):
        assert end <= start + 1e-3, blocks  # one block at a time
    note = explain.sequential_note({dp: _window(client, dp), ddp: _window(client, ddp)})
    assert note.startswith("DP and DDP trained at once on one worker, in turns of 10 steps"), note
    print(f"pair in turns, 2x20 steps: worker wall {wall_s:.1f} s; blocks {[round(e - s, 3) for s, e, _ in blocks]}")


def test_a_pair_whose_ddp_run_is_refused_in_pre_flight_starts_neither(client, redis_url, tmp_path):
    """PowerSGD on gloo over two buckets would hang (engine.modes.ddp.comm_hooks): the DDP run is refused
    in pre-flight, and its DP partner does not train alone for a comparison that cannot happen; both end
    at once, saying why."""
    dp, ddp = client.submit_pair({**PAIR, "width": 64, "depth": 4, "steps": 20, "comm_hook": "powersgd",
                                  "bucket_cap_mb": 0.01})
    with worker_process(redis_url, burst=True, name="wp-refused", log_path=tmp_path / "w.log") as proc:
        assert proc.wait(60) == 0
    recs = {r: client.get_run(r) for r in (dp, ddp)}
    assert recs[ddp]["status"] == "failed" and recs[ddp]["error"]["stage"] == "pre-flight"
    assert recs[ddp]["error"]["exception"].startswith("comm_hook: comm_hook 'powersgd' on gloo needs DDP's "
                                                      "gradients in one bucket")
    assert recs[dp]["status"] == "failed" and recs[dp]["error"]["exception"].startswith(
        "not started: its DDP partner was refused in pre-flight")
    for r in (dp, ddp):
        steps, events = _steps(client, r)
        assert steps == [] and events[-1]["type"] == "run_finished"


@pytest.mark.slow
def test_cancel_one_run_of_a_pair_the_other_trains_on_and_succeeds(client, redis_url, tmp_path):
    dp, ddp = client.submit_pair({**PAIR, "steps": 60, "step_delay_s": 0.03})
    with worker_process(redis_url, burst=True, name="wp2", log_path=tmp_path / "w.log") as proc:
        wait_for(lambda: len(_steps(client, ddp)[0]) >= 12, 60, "DDP's second turn")
        assert client.cancel(ddp) == "canceled"
        assert proc.wait(60) == 0
    log = (tmp_path / "w.log").read_text()[-3000:]
    rec_dp, rec_ddp = client.get_run(dp), client.get_run(ddp)
    assert rec_ddp["status"] == "canceled", (rec_ddp, log)
    assert rec_dp["status"] == "succeeded", (rec_dp["error"], log)
    assert rec_dp["summary"]["steps_done"] == 60
    dp_steps, ddp_steps = _steps(client, dp)[0], _steps(client, ddp)[0]
    assert [e["step"] for e in dp_steps] == list(range(60)) and 12 <= len(ddp_steps) < 60
    note = explain.sequential_note({dp: _window(client, dp), ddp: _window(client, ddp)})
    assert "DDP ended early (canceled); DP trained on alone after that." in note, note


@pytest.mark.slow
def test_a_pair_no_turn_size_divides_runs_one_after_the_other_and_says_why(client, redis_url, tmp_path):
    dp, ddp = client.submit_pair({**PAIR, "steps": 7})
    plan = client.get_run(ddp)["pair"]
    assert plan["turn_steps"] is None and "steps=7" in plan["why"]
    with worker_process(redis_url, burst=True, name="wp3", log_path=tmp_path / "w.log") as proc:
        assert proc.wait(60) == 0
    log = (tmp_path / "w.log").read_text()[-3000:]
    spans = {}
    for r in (dp, ddp):
        rec = client.get_run(r)
        assert rec["status"] == "succeeded", (rec["error"], log)
        steps, events = _steps(client, r)
        said = [e["message"] for e in events if e["type"] == "log"]
        assert any("one after the other" in m and "steps=7" in m for m in said), said
        spans[r] = _blocks(steps, 7)[0]
    assert spans[dp][1] <= spans[ddp][0], spans  # all of DP, then all of DDP
    note = explain.sequential_note({dp: _window(client, dp), ddp: _window(client, ddp)})
    assert note.startswith("DP and DDP run one after the other on one worker: no turn of 2-20 steps"), note


@pytest.mark.slow
def test_a_run_waiting_for_its_turn_is_killed_alone_when_it_cannot_stop_in_time(client, redis_url, tmp_path):
    # DDP's turns last 2 x 2.4 s: DP (one process, its loop blocked at the gate; a DDP run's
    # launcher stops its ranks by itself), canceled while it waits, reaches no stop check within
    # the client's 3 s, so the pair's job kills DP's process (not RQ's stop-job command, which
    # would end DDP too) and DDP trains on alone
    dp, ddp = client.submit_pair({**PAIR, "steps": 4, "step_delay_s": 2.4})
    with worker_process(redis_url, burst=True, name="wp4", log_path=tmp_path / "w.log") as proc:
        wait_for(lambda: _steps(client, ddp)[0], 60, "DDP's first turn, DP waiting")
        assert client.cancel(dp) == "canceled"
        assert "kills its processes (the other run of the pair trains on)" in client.get_run(dp)["error"]["exception"]
        assert proc.wait(60) == 0
    log = (tmp_path / "w.log").read_text()[-3000:]
    assert "did not stop within 4 s of its cancel; killing it" in log, log
    rec_ddp = client.get_run(ddp)
    assert rec_ddp["status"] == "succeeded" and rec_ddp["summary"]["steps_done"] == 4, (rec_ddp["error"], log)
    assert client.get_run(dp)["status"] == "canceled" and len(_steps(client, dp)[0]) == 2
    # killed while waiting: the engine never reported its end; the one run_finished is the client's
    finished = [e for e in _steps(client, dp)[1] if e["type"] == "run_finished"]
    assert len(finished) == 1 and "kills its processes" in finished[0]["error"]["exception"], finished
