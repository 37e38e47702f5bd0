"""Retention (workers.retention): hand-worked cases of which runs are deleted, on a real Redis.

Seven runs, oldest first (age in days, status, pinned):

    a 20 finished · b 10 finished pinned · c 5 started · d 3 failed · e 2 queued · f 1 canceled ·
    g 0.1 finished

keep_runs=3 keeps g f e by rank; of a b c d, b is pinned and c is running: a and d go.
keep_days=4: a b c are older than 4 days; b pinned, c running: a goes.
Both limits: a goes (both), d goes (rank): a and d.
keep_runs=6: only a is beyond the newest six. keep_runs=1 keeps g: a, d and f go (b pinned, c and
e active). No limit: nothing goes.
"""

from __future__ import annotations

import pytest

from ddpviz.workers import keys
from ddpviz.workers.retention import (
    DAY_S,
    KEEP_DAYS_ENV,
    KEEP_RUNS_ENV,
    RetentionError,
    RetentionPolicy,
    _delete,
    apply_retention,
    publish_policy,
    read_policy,
    select_prunable,
    set_pinned,
)
from ddpviz.workers.store import RunStore

NOW = 1_800_000_000.0
RUNS = [("a", 20, "succeeded", False), ("b", 10, "succeeded", True), ("c", 5, "started", False),
        ("d", 3, "failed", False), ("e", 2, "queued", False), ("f", 1, "canceled", False),
        ("g", 0.1, "succeeded", False)]
CASES = [(RetentionPolicy(3, 0), ["a", "d"]), (RetentionPolicy(0, 4), ["a"]),
         (RetentionPolicy(3, 4), ["a", "d"]), (RetentionPolicy(6, 0), ["a"]),
         (RetentionPolicy(0, 0), []), (RetentionPolicy(1, 0), ["a", "d", "f"])]


def test_hand_worked_cases_pure():
    runs = [(rid, NOW - age * DAY_S) for rid, age, _, _ in RUNS]
    status = {rid: st for rid, _, st, _ in RUNS}
    pinned = {rid for rid, *_, pin in RUNS if pin}
    for policy, want in CASES:
        assert select_prunable(runs, status, pinned, policy, NOW) == want, policy


def _store_runs(redis_client) -> None:
    store = RunStore(redis_client)
    for rid, age, status, pin in RUNS:
        store.create(rid, {"mode": "ddp"}, label=rid)
        created = NOW - age * DAY_S
        redis_client.zadd(keys.RUNS, {rid: created})
        redis_client.hset(keys.run(rid), mapping={"created_at": repr(created), "status": status})
        redis_client.xadd(keys.events(rid), {keys.EVENT_FIELD: b"{}"})
        if pin:
            assert set_pinned(redis_client, rid, True)


@pytest.mark.parametrize("policy,want", CASES)
def test_apply_retention_deletes_exactly_the_hand_worked_runs(redis_client, policy, want):
    _store_runs(redis_client)
    assert apply_retention(redis_client, policy, now=NOW) == want
    left = {rid for rid, *_ in RUNS} - set(want)
    assert {r.decode() for r in redis_client.zrange(keys.RUNS, 0, -1)} == left
    for rid, *_ in RUNS:
        gone = rid in want
        assert redis_client.exists(keys.run(rid)) == (not gone), rid
        assert redis_client.exists(keys.events(rid)) == (not gone), rid


def test_a_run_pinned_or_started_after_selection_is_not_deleted(redis_client):
    _store_runs(redis_client)
    set_pinned(redis_client, "a", True)  # pinned between selection and deletion
    redis_client.hset(keys.run("d"), "status", "started")  # re-queued and taken meanwhile
    assert not _delete(redis_client, "a") and not _delete(redis_client, "d")
    assert redis_client.exists(keys.run("a"), keys.run("d")) == 2
    assert RunStore(redis_client).get("a")["pinned"] is True
    set_pinned(redis_client, "a", False)
    assert RunStore(redis_client).get("a")["pinned"] is False
    assert _delete(redis_client, "a") and not redis_client.exists(keys.run("a"))


def test_pinning_a_missing_run_says_so(redis_client):
    assert set_pinned(redis_client, "nope", True) is False


def test_policy_from_env_and_its_errors_name_the_setting():
    assert RetentionPolicy.from_env({}) == RetentionPolicy()
    assert RetentionPolicy.from_env({KEEP_RUNS_ENV: "7", KEEP_DAYS_ENV: "1.5"}) == RetentionPolicy(7, 1.5)
    for env, name in (({KEEP_RUNS_ENV: "many"}, KEEP_RUNS_ENV), ({KEEP_DAYS_ENV: "-1"}, "keep_days"),
                      ({KEEP_RUNS_ENV: "-3"}, "keep_runs"), ({KEEP_DAYS_ENV: "nan"}, "keep_days")):
        with pytest.raises(RetentionError, match=name):
            RetentionPolicy.from_env(env)


def test_published_policy_is_what_the_runs_page_reads(redis_client):
    assert read_policy(redis_client) is None
    publish_policy(redis_client, RetentionPolicy(50, 7), "w1")
    got = read_policy(redis_client)
    assert (got["keep_runs"], got["keep_days"], got["worker"]) == (50, 7.0, "w1")
    assert "newest 50 runs" in got["text"] and "last 7 days" in got["text"]
    assert "Every run is kept" in RetentionPolicy(0, 0).describe()


def test_worker_refuses_a_bad_keep_runs_before_starting(monkeypatch, capsys):
    from ddpviz.workers.cli import commands as cli

    monkeypatch.setenv(KEEP_RUNS_ENV, "")
    with pytest.raises(SystemExit) as exc:
        cli.main(["worker", "--keep-runs", "-1", "--url", "redis://127.0.0.1:1/0"])
    assert exc.value.code == 2
    assert "keep_runs must be an integer >= 0" in capsys.readouterr().err
