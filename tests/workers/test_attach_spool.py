"""The spool of an attached run: events sent once each, in order, `run_started` first, resumed
from `sent.json` after a stop, and the run's ending (issue 24, item 3)."""

from __future__ import annotations

import json

from ddpviz.workers.attached import create_record, failure, record_ending
from ddpviz.workers.client import DdpvizClient
from ddpviz.workers.spool import SpoolForwarder
from ddpviz.workers.store import RunStore


def _line(**e) -> str:
    return json.dumps({"run_id": "r1", "ts": 0.0, **e}) + "\n"


def _step(rank: int, step: int) -> str:
    return _line(type="step", rank=rank, step=step, device=f"cpu:{rank}", loss=1.0, samples=8,
                 step_time_s=0.1, forward_s=0.01, backward_s=0.02, comm_exposed_s=0.0, optimizer_s=0.01)


def test_events_are_sent_once_with_run_started_first_and_resume_after_a_stop(tmp_path, redis_client):
    store = RunStore(redis_client)
    create_record(store, "r1", ["torchrun", "train.py"], "x")
    r0, r1 = tmp_path / "events-rank0-pid1.jsonl", tmp_path / "events-rank1-pid2.jsonl"
    r0.write_text(_step(0, 0) + _step(0, 1) + _line(type="run_started", rank=0, config={"world_size": 2}))
    r1.write_text(_step(1, 0) + '{"type": "step", "ran')  # a line still being written
    fwd = SpoolForwarder(tmp_path, "r1", store)
    assert fwd.pump()
    client = DdpvizClient(redis=redis_client)
    events, _ = client.read_events("r1")
    assert events[0]["type"] == "run_started"
    assert sorted((e["rank"], e["step"]) for e in events if e["type"] == "step") == [(0, 0), (0, 1), (1, 0)]
    assert client.get_run("r1")["config"]["world_size"] == 2
    assert client.get_run("r1")["config"]["command"] == ["torchrun", "train.py"]
    # the unfinished line completes; a new forwarder (a restarted `ddpviz upload`) sends only what is new
    with open(r1, "w") as fh:
        fh.write(_step(1, 0) + _step(1, 1))
    with open(r0, "a") as fh:
        fh.write(_step(0, 2))
    again = SpoolForwarder(tmp_path, "r1", store)
    assert again.pump(final=True)
    events, _ = client.read_events("r1")
    steps = sorted((e["rank"], e["step"]) for e in events if e["type"] == "step")
    assert steps == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    assert [e["type"] for e in events].count("run_started") == 1
    assert again.summary()["steps_done"] == 3  # the summary sees every event, sent before or now
    assert record_ending(store, "r1", {"status": "succeeded", "error": None})
    rec = client.get_run("r1")
    assert rec["status"] == "succeeded" and rec["config"]["steps"] == 3


def test_nothing_is_sent_or_lost_while_redis_is_away(tmp_path, redis_client):
    (tmp_path / "events-rank0-pid1.jsonl").write_text(_line(type="run_started", rank=0) + _step(0, 0))
    fwd = SpoolForwarder(tmp_path, "r2", None)  # no Redis
    assert not fwd.pump()
    assert fwd.pending and not (tmp_path / "sent.json").exists()
    store = RunStore(redis_client)
    create_record(store, "r2", None, None)
    fwd.connect(store)
    assert fwd.pump()
    assert [e["type"] for e in DdpvizClient(redis=redis_client).read_events("r2")[0]] == ["run_started", "step"]


def test_the_failing_ranks_exception_comes_from_torchruns_error_file(tmp_path):
    (tmp_path / "error.json").write_text(json.dumps({"message": {
        "message": "ValueError: bad batch", "extraInfo": {"py_callstack": "Traceback ...", "rank": 1}},
        "errorCode": 1}))
    err = failure(tmp_path, 1)
    assert (err["rank"], err["exception"], err["traceback"]) == (1, "ValueError: bad batch", "Traceback ...")
    said = failure(tmp_path / "none", 3)["exception"]
    assert said.startswith("CommandFailed: the command exited with code 3. ") and "terminal" in said
    # torchrun's error file is named only where torchrun ran (a one-process command has none: a new user)
    (tmp_path / "none").mkdir()
    script = tmp_path / "t.py"
    script.write_text("raise SystemExit(3)\n")
    assert "torchrun" in failure(tmp_path / "none", 3, ["torchrun", "--nproc-per-node", "2", str(script)])["exception"]
    alone = failure(tmp_path / "none", 3, ["python", str(script)])["exception"]
    assert "terminal" in alone and "torchrun" not in alone


def test_the_root_cause_is_the_rank_that_failed_first_not_torchruns_tie_pick(tmp_path, monkeypatch):
    """Rank 1 raises; rank 0 fails in the same second because rank 1's process went (gloo: connection closed).
    torchrun keeps whole seconds and takes the lowest rank on a tie (ChildFailedError.get_first_failure), so its
    error.json named rank 0 (tests/workers/test_attach_endings.py went red so once, 2026-12-06). Each rank's
    excepthook also leaves its exception in the spool with `time_ns`; the earliest is the run's error."""
    import sys

    from ddpviz.engine.attach.errors import error_payload, install_excepthook

    monkeypatch.setattr(sys, "excepthook", lambda *a: None)
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    rank = {"r": 1}
    install_excepthook(lambda: rank["r"], tmp_path)
    try:
        raise ValueError("bad batch at step 3")
    except ValueError as exc:
        sys.excepthook(type(exc), exc, exc.__traceback__)
    rank["r"] = 0
    later = RuntimeError("Connection closed by peer")
    sys.excepthook(type(later), later, None)
    one, zero = (json.loads((tmp_path / f"error-rank{r}.json").read_text())["message"]["extraInfo"] for r in (1, 0))
    assert one["time_ns"] < zero["time_ns"] and (tmp_path / "error-rank1.json").stat().st_mode & 0o077 == 0
    (tmp_path / "error.json").write_text(json.dumps(error_payload(later, 0)))  # torchrun's copy: its tie pick
    err = failure(tmp_path, 1)
    assert (err["rank"], err["exception"]) == (1, "ValueError: bad batch at step 3")
    assert "raise ValueError" in err["traceback"]


def test_a_joined_nodes_events_go_out_once_another_node_stored_run_started(tmp_path, redis_client):
    """Rank 0 runs on node 0: node 1's spool never sees `run_started`. Its events wait only until
    node 0's launcher has stored it (they waited the whole 60 s hold before), and still come after it."""
    store = RunStore(redis_client)
    create_record(store, "r1", ["torchrun", "--nnodes", "2", "train.py"], "x")
    node0, node1 = tmp_path / "node0", tmp_path / "node1"
    node0.mkdir()
    node1.mkdir()
    (node1 / "events-rank1-pid7.jsonl").write_text(_step(1, 0) + _step(1, 1))
    joined = SpoolForwarder(node1, "r1", store)
    assert not joined.pump(now=100.0)  # nothing stored yet: it holds
    (node0 / "events-rank0-pid3.jsonl").write_text(_step(0, 0) + _line(type="run_started", rank=0, config={}))
    assert SpoolForwarder(node0, "r1", store).pump(now=100.5)
    assert joined.pump(now=101.0)  # one second later, not sixty
    events, _ = DdpvizClient(redis=redis_client).read_events("r1")
    assert events[0]["type"] == "run_started"
    assert sorted((e["rank"], e["step"]) for e in events if e["type"] == "step") == [(0, 0), (1, 0), (1, 1)]


def test_a_second_rank_0_process_says_its_steps_restart_once(tmp_path, redis_client):
    # a sweep driver's second torchrun (or torchrun restarting its workers): rank 0 in a new process counts from 0
    # again; the run holding both said nothing (a new user's two trainings, steps 0-9 twice, 2026-12-06)
    store = RunStore(redis_client)
    create_record(store, "r1", ["python", "sweep.py"], "x")
    (tmp_path / "events-rank0-pid11.jsonl").write_text(_line(type="run_started", rank=0) + _step(0, 0) + _step(0, 1))
    (tmp_path / "events-rank1-pid12.jsonl").write_text(_step(1, 0) + _step(1, 1))
    fwd = SpoolForwarder(tmp_path, "r1", store)
    assert fwd.pump()
    client = DdpvizClient(redis=redis_client)
    assert not [e for e in client.read_events("r1")[0] if e["type"] == "log"]  # one process per rank: nothing to say
    (tmp_path / "events-rank0-pid21.jsonl").write_text(_step(0, 0))
    (tmp_path / "events-rank1-pid22.jsonl").write_text(_step(1, 0))
    assert fwd.pump()
    assert SpoolForwarder(tmp_path, "r1", store).pump(final=True)  # a restarted upload: said once
    logs = [e for e in client.read_events("r1")[0] if e["type"] == "log"]
    assert len(logs) == 1 and logs[0]["level"] == "warning" and "(pids 11, 21:" in logs[0]["message"]
    assert "steps of the same number from each" in logs[0]["message"]
