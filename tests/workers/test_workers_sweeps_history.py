"""ddpviz.workers.sweeps (trios and sweeps as groups of runs) and workers.history (delete, re-run, read
all, persistence across a Redis restart), against a real Redis."""

import pytest

from ddpviz.engine.config import ConfigError
from ddpviz.workers import keys
from ddpviz.workers.client import DdpvizClient
from ddpviz.workers.connection import EmbeddedRedis, connect
from ddpviz.workers.history import RunActive, delete_run, read_all_events, rerun
from ddpviz.workers.sink import RedisStreamWriter
from ddpviz.workers.store import RunStatus
from ddpviz.workers.sweeps import MAX_SWEEP_RUNS, list_sweeps, submit_sweep, submit_trio, sweep_kind, sweep_runs

BASE = {"world_size": 2, "steps": 3, "global_batch_size": 64}


@pytest.fixture
def client(redis_client):
    return DdpvizClient(redis=redis_client)


def _finish(client, run_id, events=()):
    client.store.mark_started(run_id, "w")
    if events:
        RedisStreamWriter(client.redis, run_id).write_batch(list(events))
    client.store.finish(run_id, RunStatus.SUCCEEDED, summary={"samples_per_s": 1.0})


def test_trio_shares_group_and_config(client):
    group, ids = submit_trio(client, {**BASE, "mode": "dp", "seed": 7})
    runs = [client.get_run(ids[m]) for m in ("single", "dp", "ddp")]
    assert [r["config"]["mode"] for r in runs] == ["single", "dp", "ddp"]
    assert [r["label"] for r in runs] == ["single", "DP", "DDP"]
    assert {r["group"] for r in runs} == {group} and group.startswith("trio-")
    assert {r["config"]["seed"] for r in runs} == {7}
    assert {r["status"] for r in runs} == {"queued"}


def test_world_size_sweep(client):
    sweep = submit_sweep(client, BASE, "world_size", [4, 1, 2, 2])
    assert sweep_kind(sweep) == "world_size"
    runs = sweep_runs(client, sweep)
    assert [(r["config"]["mode"], r["config"]["world_size"]) for r in runs] == [
        ("single", 1), ("dp", 1), ("ddp", 1), ("dp", 2), ("ddp", 2), ("dp", 4), ("ddp", 4)]
    assert [r["label"] for r in runs][:3] == ["single", "DP ×1", "DDP ×1"]
    assert list(list_sweeps(client)) == [sweep]


def test_bucket_and_overlap_sweeps(client):
    caps = submit_sweep(client, BASE, "bucket_cap_mb", [25, 0.01])
    assert [r["config"]["bucket_cap_mb"] for r in sweep_runs(client, caps)] == [0.01, 25.0]
    assert {r["config"]["mode"] for r in sweep_runs(client, caps)} == {"ddp"}
    ov = submit_sweep(client, BASE, "overlap", [False, True])
    assert [r["config"]["overlap"] for r in sweep_runs(client, ov)] == [True, False]
    assert sweep_kind(ov) == "overlap" and sweep_kind("trio-abc") is None


def test_invalid_sweep_submits_nothing(client):
    with pytest.raises(ConfigError) as info:
        submit_sweep(client, BASE, "world_size", [2, 3])  # 64 is not divisible by 3
    assert any(field == "global_batch_size" and "DP ×3" in msg for field, msg in info.value.errors)
    with pytest.raises(ValueError, match="kind"):
        submit_sweep(client, BASE, "lr", [1])
    with pytest.raises(ValueError, match="at most"):
        submit_sweep(client, {**BASE, "global_batch_size": 64}, "bucket_cap_mb",
                     [0.01 * (i + 1) for i in range(MAX_SWEEP_RUNS + 1)])
    assert client.list_runs() == []


def test_delete_run_removes_record_stream_and_index(client):
    rid = client.submit(BASE)
    with pytest.raises(RunActive):
        delete_run(client, rid)
    _finish(client, rid, [{"type": "step", "run_id": rid, "ts": 1.0, "step": 0}])
    other = client.submit(BASE)
    assert delete_run(client, rid) is True
    assert client.get_run(rid) is None
    assert not client.redis.exists(keys.run(rid), keys.events(rid))
    assert [r["run_id"] for r in client.list_runs()] == [other]
    assert delete_run(client, rid) is False


def test_rerun_submits_same_config_as_new_run(client):
    rid = client.submit({**BASE, "lr": 0.2}, label="mine")
    _finish(client, rid)
    new = rerun(client, rid)
    assert new != rid
    again = client.get_run(new)
    assert again["config"] == client.get_run(rid)["config"] and again["label"] == "mine"
    assert again["status"] == "queued"
    with pytest.raises(KeyError):
        rerun(client, "nope")


def test_read_all_events_in_batches(client, monkeypatch):
    import ddpviz.workers.history
    from ddpviz import workers  # noqa: E402

    rid = client.submit(BASE)
    events = [{"type": "step", "run_id": rid, "ts": float(i), "step": i} for i in range(23)]
    _finish(client, rid, events)
    monkeypatch.setattr(workers.history, "READ_BATCH", 5)
    assert [e["step"] for e in read_all_events(client, rid)] == list(range(23))
    assert len(read_all_events(client, rid, max_events=7)) == 7


def test_history_survives_a_redis_restart(tmp_path):
    """The embedded server `ddpviz up` starts keeps an append-only file: records, streams and
    sweeps are there after a restart."""
    server = EmbeddedRedis(tmp_path / "redis", persist=True).start()
    try:
        client = DdpvizClient(redis=connect(server.url))
        sweep = submit_sweep(client, BASE, "overlap", [True, False])
        rid = sweep_runs(client, sweep)[0]["run_id"]
        _finish(client, rid, [{"type": "step", "run_id": rid, "ts": 1.0, "step": 0}])
        client.redis.close()
    finally:
        server.stop()
    server = EmbeddedRedis(tmp_path / "redis", persist=True).start()
    try:
        client = DdpvizClient(redis=connect(server.url))
        assert client.get_run(rid)["status"] == "succeeded"
        assert [e["step"] for e in read_all_events(client, rid)] == [0]
        assert len(sweep_runs(client, sweep)) == 2
        client.redis.close()
    finally:
        server.stop()
