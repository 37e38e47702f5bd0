"""An uploaded run shows when it ran, not when it was uploaded (issue 33.4): `ddpviz upload` of a
spool records the run's start from the spool's meta.json and its end from ending.json; the Runs
table's wall time is that end minus that start, and its final validation accuracy the summary's."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pytest

from ddpviz.app.frames import runs as fruns
from ddpviz.workers.cli.attach import cmd_upload
from ddpviz.workers.client import DdpvizClient

RECORDED = Path(__file__).parents[1] / "app" / "data" / "real_attached_regression_ws2.jsonl"
RAN_AT = 1_700_000_000.0  # the run started then (2023-11-14), long before this test uploads it
RAN_FOR_S = 42.5


def _spool(tmp_path: Path, run_id: str) -> Path:
    spool = tmp_path / "spool"
    spool.mkdir()
    events = [json.loads(line) for line in RECORDED.read_text().splitlines() if line.strip()]
    with open(spool / "events-rank0-pid1.jsonl", "w", encoding="utf-8") as fh:
        for e in events:
            fh.write(json.dumps({**e, "run_id": run_id}) + "\n")
    (spool / "meta.json").write_text(json.dumps(dict(run_id=run_id, command=["torchrun", "t.py"], label=None,
                                                     host="h", created_at=RAN_AT, joined=False)))
    (spool / "ending.json").write_text(json.dumps(dict(status="succeeded", error=None, exit_code=0,
                                                       ended_at=RAN_AT + RAN_FOR_S)))
    return spool


def test_uploaded_run_keeps_when_it_ran(tmp_path, redis_url, redis_client):
    spool = _spool(tmp_path, "upl0ad0run")
    before = time.time()
    assert cmd_upload(argparse.Namespace(spool=str(spool), url=redis_url)) == 0
    rec = DdpvizClient(redis=redis_client).get_run("upl0ad0run")
    assert rec["status"] == "succeeded"
    assert rec["created_at"] == rec["started_at"] == RAN_AT  # not the upload's time (>= before)
    assert rec["finished_at"] == RAN_AT + RAN_FOR_S and before > rec["finished_at"]
    row = fruns.runs_frame([rec]).iloc[0]
    assert row["created"].timestamp() == pytest.approx(RAN_AT)
    assert row["wall_s"] == pytest.approx(RAN_FOR_S)


def test_runs_table_shows_wall_time_and_final_validation_accuracy():
    done = {"run_id": "a", "config": {"mode": "ddp"}, "created_at": 10.0, "started_at": 11.0,
            "finished_at": 71.5, "summary": {"samples_per_s": 100.0, "val_accuracy": 0.8125}}
    running = {"run_id": "b", "config": {"mode": "dp"}, "created_at": 12.0, "started_at": 12.5,
               "finished_at": None, "summary": None}
    df = fruns.runs_frame([done, running]).set_index("run_id")
    assert df.loc["a", "wall_s"] == pytest.approx(60.5) and df.loc["a", "val_accuracy"] == 0.8125
    assert df.loc["b", ["wall_s", "val_accuracy"]].isna().all()  # not measured yet: blank, never 0


def test_upload_falls_back_from_the_runs_own_dead_redis_to_the_running_up(tmp_path, redis_url, redis_client,
                                                                           monkeypatch, capsys):
    """The run's own Redis (kept in the spool) is gone, this user's `ddpviz up` runs: upload stores the run there
    and says which it tried (before 2026-12-06 it stopped at the dead one, telling the user to run `ddpviz up`)."""
    from ddpviz.workers.connection import remove_up_url, write_up_url

    spool = _spool(tmp_path, "upl0adfallback")
    meta = json.loads((spool / "meta.json").read_text())
    (spool / "meta.json").write_text(json.dumps({**meta, "redis_url": "redis://127.0.0.1:1/0"}))
    monkeypatch.delenv("REDIS_URL", raising=False)
    write_up_url(redis_url)  # as `ddpviz up` does (tests/conftest.py: this test's own DDPVIZ_HOME)
    try:
        assert cmd_upload(argparse.Namespace(spool=str(spool), url=None)) == 0
    finally:
        remove_up_url()
    assert DdpvizClient(redis=redis_client).get_run("upl0adfallback")["status"] == "succeeded"
    err = capsys.readouterr().err
    assert "the run's own Redis, redis://127.0.0.1:1/0, did not answer; trying" in err
