"""`ddpviz tune` without a Redis that answers: it fails open (one line says nothing is stored, the
answer is printed, no traceback), and a Redis lost mid-search is said once and stores nothing more
(`workers.tunes.TuneKeeper`). No trial runs here; tests/workers/test_tune_cli.py stores real ones."""

from __future__ import annotations

import json

from ddpviz.workers.cli.commands import main
from ddpviz.workers.connection import connect, free_port
from ddpviz.workers.store import RunStore
from ddpviz.workers.tunes import TuneKeeper, list_tunes

NOTHING_STORED = "does not answer: nothing of this search is stored"


def _dead_url() -> str:
    return f"redis://127.0.0.1:{free_port()}/0"  # a port nothing listens on


def test_without_redis_tune_says_once_that_nothing_is_stored_and_prints_the_answer(monkeypatch, capsys):
    import ddpviz.workers.cli.tune as cli_tune

    seen = {}

    def search(cmd, steps, warmup, budget_s, knobs, rounds, tries, keeper):
        seen["store"] = keeper.store
        return dict(command=cmd, trials=[], best=None, answer="none beat the baseline beyond noise")

    monkeypatch.setattr(cli_tune, "tune", search)
    try:
        main(["tune", "--url", _dead_url(), "--json", "--", "true"])
    except SystemExit as exc:
        assert exc.code == 0
    out, err = capsys.readouterr()
    assert seen == {"store": None}
    assert err.count(NOTHING_STORED) == 1 and "Traceback" not in err and "stored as tune" not in err
    rep = json.loads(out)
    assert rep["command"] == ["true"] and "tune_id" not in rep


def test_a_redis_lost_mid_search_is_said_once_and_nothing_more_is_stored(tmp_path):
    said: list[str] = []
    store = RunStore(connect(_dead_url(), check=False, retry_attempts=0, socket_timeout_s=1.0))
    keeper = TuneKeeper(store, ["true"], said.append)
    spool = tmp_path / "trial0"
    spool.mkdir()
    (spool / "events-0.jsonl").write_text(json.dumps({"type": "step", "run_id": "r", "step": 0}) + "\n")
    trial = dict(error=None, exit_code=0, started_at=1.0, wall_s=2.0)
    assert keeper.keep_trial(spool, trial, "r", "tune x · baseline · reference") is None
    assert len(said) == 1 and "Redis stopped answering" in said[0]
    assert keeper.new_run() is None  # the next trials run unstored
    rep = {"answer": "none"}
    assert keeper.keep_report(rep) is None and "tune_id" not in rep
    assert len(said) == 1


def test_a_kept_report_round_trips_newest_first(redis_url, redis_client):
    keeper = TuneKeeper(RunStore(redis_client), ["true"], lambda m: None)
    first = {"answer": "a", "trials": [{"knobs": {"bucket_cap_mb": 4.0}, "ratio": 0.9}]}
    assert keeper.keep_report(first) == keeper.tune_id == first["tune_id"]
    second = TuneKeeper(RunStore(redis_client), ["true"], lambda m: None)
    later = {"answer": "b"}
    second.keep_report(later)
    stored = list_tunes(redis_client)
    assert [r["tune_id"] for r in stored] == [second.tune_id, keeper.tune_id]
    assert {k: v for k, v in stored[1].items() if k != "stored_at"} == first
