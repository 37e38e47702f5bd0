"""The ddpviz command: refusals, unreachable Redis, train, submit/runs/cancel/export, --wait."""

from __future__ import annotations

import json

import pytest
from wtools import TINY, cli_env, ddpviz, worker_process

from ddpviz.engine.config import RunConfig
from ddpviz.engine.events import read_jsonl
from ddpviz.workers.cli.commands import build_parser
from ddpviz.workers.cli.flags import flag_name, run_fields
from ddpviz.workers.client import DdpvizClient
from ddpviz.workers.connection import free_port


def tiny_flags(**over) -> list[str]:
    out = []
    for k, v in {**TINY, **over}.items():
        out += [flag_name(k), str(v)]
    return out


def test_every_run_config_field_has_a_flag():
    parser = build_parser()
    args = parser.parse_args(["train", "--world-size", "3", "--no-overlap", "--static-graph"])
    assert run_fields(args) == {"world_size": 3, "overlap": False, "static_graph": True}
    assert run_fields(parser.parse_args(["submit"])) == {}  # only what the user set
    text = parser._subparsers._group_actions[0].choices["train"].format_help()
    for name in RunConfig.model_fields:
        assert flag_name(name) in text, name
    assert "--no-overlap" in text


def test_train_refuses_a_bad_setting_naming_the_field():
    res = ddpviz("train", "--world-size", "0", env=cli_env())
    assert res.returncode == 2
    assert "world_size" in res.stderr and "--world-size" in res.stderr
    assert "Traceback" not in res.stderr + res.stdout


def test_submit_refuses_a_bad_setting_before_touching_redis():
    res = ddpviz("submit", "--global-batch-size", "7", "--world-size", "2",
                 env=cli_env(f"redis://127.0.0.1:{free_port()}/0"))
    assert res.returncode == 2 and "global_batch_size" in res.stderr
    assert "Traceback" not in res.stderr


def test_submit_to_unreachable_redis_names_the_url():
    port = free_port()
    res = ddpviz("submit", "--steps", "3", env=cli_env(f"redis://:pw123@127.0.0.1:{port}/0"))
    assert res.returncode == 2
    assert f"127.0.0.1:{port}" in res.stderr and "pw123" not in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.slow
def test_train_runs_here_and_writes_events(tmp_path):
    out = tmp_path / "run.jsonl"
    res = ddpviz("train", "--mode", "single", "--world-size", "1", *tiny_flags(),
                 "--events", str(out), "--run-id", "cli1", env=cli_env())
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("run cli1 succeeded: 5 steps")
    events = read_jsonl(out)
    assert events[0]["type"] == "run_started" and events[-1]["type"] == "run_finished"
    assert {e["run_id"] for e in events} == {"cli1"}
    assert sum(e["type"] == "step" for e in events) == 5


@pytest.mark.slow
def test_train_exits_non_zero_when_the_run_fails(tmp_path):
    res = ddpviz("train", "--mode", "single", "--world-size", "1", *tiny_flags(),
                 "--fault", "raise", "--fault-step", "1", env=cli_env())
    assert res.returncode == 1
    assert "failed" in res.stdout and "injected fault" in res.stdout
    assert "Traceback" not in res.stderr


def test_submit_runs_cancel_export_round_trip(redis_client, redis_url, tmp_path):
    env = cli_env(redis_url)
    res = ddpviz("submit", *tiny_flags(), "--label", "cli", env=env)
    assert res.returncode == 0, res.stderr
    run_id = res.stdout.strip()
    res = ddpviz("submit", "--pair", *tiny_flags(), env=env)
    dp_id, ddp_id = res.stdout.split()

    res = ddpviz("runs", env=env)
    assert res.returncode == 0 and run_id in res.stdout and "queued" in res.stdout
    listed = json.loads(ddpviz("runs", "--json", env=env).stdout)
    assert [r["run_id"] for r in listed][-1] == run_id and len(listed) == 3
    assert {r["label"] for r in listed} == {"cli", "DP", "DDP"}

    res = ddpviz("cancel", run_id, env=env)
    assert res.returncode == 0 and res.stdout.strip() == "canceled"
    again = ddpviz("cancel", run_id, env=env)  # already ended: said so, nothing changes
    assert again.returncode == 0 and "already ended (canceled); nothing to cancel" in again.stderr
    assert ddpviz("cancel", "nope", env=env).returncode == 1

    out = tmp_path / "ev.jsonl"
    res = ddpviz("export", run_id, "--out", str(out), env=env)
    assert res.returncode == 0
    assert [e["type"] for e in read_jsonl(out)] == ["run_finished"]
    assert ddpviz("export", "nope", env=env).returncode == 1
    DdpvizClient(redis=redis_client).cancel(dp_id)


@pytest.mark.slow
def test_submit_wait_follows_the_run_to_its_end(redis_client, redis_url):
    env = cli_env(redis_url)
    with worker_process(redis_url, burst=False):
        res = ddpviz("submit", "--mode", "single", "--world-size", "1", *tiny_flags(), "--wait",
                     env=env, timeout=90)
        assert res.returncode == 0, res.stderr
        run_id = res.stdout.split()[0]
        assert f"run {run_id} succeeded: 5 steps" in res.stdout
        res = ddpviz("submit", "--mode", "single", "--world-size", "1", *tiny_flags(),
                     "--fault", "raise", "--fault-step", "0", "--wait", env=env, timeout=90)
        assert res.returncode == 1 and "failed" in res.stdout


def test_compare_of_dp_and_ddp_runs_in_turns_by_default_and_says_so(monkeypatch, capsys):
    import ddpviz.engine.harness.compare as harness
    from ddpviz.engine.result import RunResult

    got = []

    def fake(cfg, modes, on_mode, turns=None):
        got.append((modes, turns))
        return {m: harness.mode_report(RunResult("succeeded", summary={"samples_per_s": 1.0}), None) for m in modes}
    monkeypatch.setattr(harness, "compare", fake)
    for argv in (["--modes", "dp,ddp", "--steps", "20"], ["--modes", "single,dp,ddp", "--steps", "20"],
                 ["--modes", "dp,ddp", "--steps", "20", "--turns", "0"]):
        args = build_parser().parse_args(["compare", *argv])
        assert args.handler(args) == 0
    assert got == [(("dp", "ddp"), 10), (("single", "dp", "ddp"), None), (("dp", "ddp"), None)]
    out = capsys.readouterr()
    assert "dp, ddp at once, in turns of 10 steps (2 turns each)" in out.err and "'single' is among --modes" in out.err
    # without a single run there is no speed-up or parameter difference to show: no column for them (the
    # tour, issue 33: "- vs single"); with one, a dash where a rate is missing, never x0.00 or None
    lines = [line for line in out.out.splitlines() if line.startswith("dp ")]
    assert len(lines) == 3 and "vs single" not in lines[0] + lines[2], lines
    assert "- vs single" in lines[1] and lines[1].endswith("max |Δθ| vs single -"), lines[1]


def test_compare_says_exposed_comm_not_measured_where_the_run_could_not_measure_it(monkeypatch, capsys):
    """`ddpviz compare`'s line for FSDP on CUDA (summary `comm_exposed_s` null with its note, as
    `engine.summary` writes it): the words, never a number (issue 20, item 4)."""
    import ddpviz.engine.harness.compare as harness
    from ddpviz.engine.result import RunResult

    summaries = {"ddp": {"samples_per_s": 100.0, "comm_exposed_s": 0.0015},
                 "fsdp": {"samples_per_s": 90.0, "comm_exposed_s": None, "comm_exposed_note": "not measured on CUDA"}}
    monkeypatch.setattr(harness, "compare", lambda cfg, modes, on_mode, turns=None: {
        m: harness.mode_report(RunResult("succeeded", summary=summaries[m]), None) for m in modes})
    args = build_parser().parse_args(["compare", "--modes", "ddp,fsdp", "--steps", "3"])
    assert args.handler(args) == 0
    lines = dict(line.split(maxsplit=1) for line in capsys.readouterr().out.splitlines())
    assert "exposed comm not measured on CUDA " in lines["fsdp"]
    assert "exposed comm 1.50 ms " in lines["ddp"]


def test_compare_says_why_fsdp_overlaps_nothing_on_cpu(monkeypatch, capsys):
    """FSDP's overlap is measured on the host clock only (CPU, gloo), where its collectives block the training
    thread: `ddpviz compare` says so beside the 0%, as Compare does; DDP's figure stands alone."""
    import ddpviz.engine.harness.compare as harness
    from ddpviz.engine.result import RunResult
    from ddpviz.engine.summary import FSDP_HOST_BLOCKING

    summaries = {"ddp": {"samples_per_s": 100.0, "comm_exposed_s": 0.0015, "overlap": 0.25},
                 "fsdp": {"samples_per_s": 90.0, "comm_exposed_s": 0.004, "overlap": 0.0}}
    monkeypatch.setattr(harness, "compare", lambda cfg, modes, on_mode, turns=None: {
        m: harness.mode_report(RunResult("succeeded", summary=summaries[m]), None, m) for m in modes})
    args = build_parser().parse_args(["compare", "--modes", "ddp,fsdp", "--steps", "3"])
    assert args.handler(args) == 0
    lines = dict(line.split(maxsplit=1) for line in capsys.readouterr().out.splitlines())
    assert f"overlap 0% (by construction on CPU: {FSDP_HOST_BLOCKING}) " in lines["fsdp"]
    assert "overlap 25% " in lines["ddp"] and "by construction" not in lines["ddp"]


def test_compare_names_dps_copies_for_what_they_are_in_its_lines_and_json(monkeypatch, capsys):
    """DP's `comm_exposed_s` is its copies through device 0 (scatter, gather, reduce, broadcast), never exposed
    comm: `ddpviz compare` calls it as the app does (issue 33.4), in its text and its --json (`comm_part`)."""
    import json

    import ddpviz.engine.harness.compare as harness
    from ddpviz.engine.result import RunResult

    summaries = {"dp": {"samples_per_s": 90.0, "comm_exposed_s": 0.002, "overlap": 0.0},
                 "ddp": {"samples_per_s": 100.0, "comm_exposed_s": 0.0015, "overlap": None}}
    monkeypatch.setattr(harness, "compare", lambda cfg, modes, on_mode, turns=None: {
        m: harness.mode_report(RunResult("succeeded", summary=summaries[m]), None, m) for m in modes})
    args = build_parser().parse_args(["compare", "--modes", "dp,ddp", "--steps", "3"])
    assert args.handler(args) == 0
    lines = dict(line.split(maxsplit=1) for line in capsys.readouterr().out.splitlines() if line[:3] in ("dp ", "ddp"))
    assert "DP copies 2.00 ms " in lines["dp"] and "exposed comm" not in lines["dp"]
    assert "exposed comm 1.50 ms " in lines["ddp"]
    # DP all-reduces nothing: no overlap figure (not a measured-looking 0.0); DDP's unmeasured one says so
    assert "overlap" not in lines["dp"] and "overlap not measured " in lines["ddp"]
    args = build_parser().parse_args(["compare", "--modes", "dp,ddp", "--steps", "3", "--json"])
    assert args.handler(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["dp"]["comm_part"], report["ddp"]["comm_part"]) == ("DP copies", "exposed comm")
    assert report["dp"]["step_time_split"]["comm_exposed_s"] == 0.002


def test_compare_refuses_a_mode_twice_and_a_mode_flag_before_anything_runs(monkeypatch, capsys):
    """`--modes ddp,ddp` trained two runs and printed one; `--mode zzz` was ignored and the default set ran
    (a new user, 2026-12-06). Both are refused, exit 2, before compare is called."""
    import ddpviz.engine.harness.compare as harness

    called = []
    monkeypatch.setattr(harness, "compare", lambda *a, **k: called.append(1) or {})
    for argv, said in ((["--modes", "ddp,dp,ddp"], "--modes lists ddp twice"),
                       (["--mode", "zzz", "--modes", "single"], "--mode: compare runs the modes of --modes")):
        args = build_parser().parse_args(["compare", *argv, "--steps", "2"])
        assert args.handler(args) == 2
        assert said in capsys.readouterr().err
    assert called == []


def test_compare_gives_single_no_communication_figure_and_an_unchecked_sync_no_none(monkeypatch, capsys):
    """single printed "exposed comm 0.00 ms replicas in sync None" and max |Δθ| unrounded (a new user,
    2026-12-06); the Compare page shows a dash for single's communication (docs/views.md)."""
    import ddpviz.engine.harness.compare as harness
    from ddpviz.engine.result import RunResult

    def fake(cfg, modes, on_mode, turns=None):
        out = {m: harness.mode_report(RunResult("succeeded", summary={"samples_per_s": 10.0, "comm_exposed_s": 0.0}),
                                      None, m) for m in modes}
        out["fsdp"]["replicas_in_sync"], out["fsdp"]["max_param_diff_vs_single"] = None, 6.146728992462158e-08
        return out
    monkeypatch.setattr(harness, "compare", fake)
    args = build_parser().parse_args(["compare", "--modes", "single,fsdp", "--steps", "2"])
    assert args.handler(args) in (0, 1)
    lines = dict(line.split(maxsplit=1) for line in capsys.readouterr().out.splitlines()
                 if line[:6] in ("single", "fsdp  "))
    assert "no communication (one device)" in lines["single"] and "0.00 ms" not in lines["single"]
    assert "None" not in lines["single"] + lines["fsdp"] and lines["fsdp"].endswith("max |Δθ| vs single 6.15e-08")
    # --json: single's comm is null with its reason, not the engine's constant 0.0 (its steps measure nothing)
    args = build_parser().parse_args(["compare", "--modes", "single,fsdp", "--steps", "2", "--json"])
    args.handler(args)
    report = json.loads(capsys.readouterr().out)
    assert report["single"]["step_time_split"]["comm_exposed_s"] is None
    assert report["single"]["comm_exposed_note"] == "no communication (one device)"
    assert report["fsdp"]["step_time_split"]["comm_exposed_s"] == 0.0  # FSDP on CPU: measured, kept


def test_runs_refuses_a_limit_below_one_naming_the_flag(capsys):
    """`ddpviz runs --limit 0` and `--limit -3` printed a header and no run (a new user, 2026-12-06)."""
    for bad in ("0", "-3", "x"):
        with pytest.raises(SystemExit) as exit_:
            build_parser().parse_args(["runs", "--limit", bad])
        assert exit_.value.code == 2 and "argument --limit: must be" in capsys.readouterr().err
    assert build_parser().parse_args(["runs", "--limit", "1"]).limit == 1


def test_submit_wait_says_once_that_no_worker_serves_the_queue(monkeypatch, capsys):
    """`ddpviz up --workers 0` then `submit --wait`: it printed the run id and sat silent (a new user,
    2026-12-06). A queued run with no live worker is said once on stderr; the run then ends (canceled here)."""
    import ddpviz.workers.cli.commands as commands
    from ddpviz.workers.heartbeat import NO_WORKER

    class Queue:
        polls = 0

        def get_run(self, rid):
            self.polls += 1
            return {"status": "queued" if self.polls < 8 else "canceled", "config": {"steps": 5}, "label": None,
                    "summary": None, "error": None}

        def read_events(self, rid, last):
            return [], last

        def workers(self):
            return []

    monkeypatch.setattr(commands, "WAIT_POLL_S", 0.0)
    assert commands.follow(Queue(), ["r1"]) == 1
    err = capsys.readouterr().err
    assert err.count(NO_WORKER) == 1 and "Ctrl-C stops following" in err


def test_a_canceled_runs_error_says_canceled_once_per_part():
    """"Canceled: canceled by user (canceled: every rank process was stopped)" (a new user, 2026-12-06): the
    engine's own "canceled: " is not repeated inside the worker's sentence."""
    from types import SimpleNamespace

    from ddpviz.workers.jobs.run import _stop_outcome

    poller = SimpleNamespace(kind="cancel", reason="canceled by user")
    status, error = _stop_outcome(poller, {"exception": "canceled: every rank process was stopped"})
    assert status.value == "canceled"
    assert error["exception"] == "Canceled: canceled by user (every rank process was stopped)"


def test_a_label_longer_than_80_characters_is_refused_before_anything_is_stored(redis_client):
    """A 300-character label was accepted and widened `ddpviz runs` and every picker (a new user, 2026-12-06)."""
    from ddpviz.engine.config import ConfigError

    client = DdpvizClient(redis=redis_client)
    with pytest.raises(ConfigError) as refused:
        client.submit_pair({"steps": 2}, label="x" * 300)
    assert dict(refused.value.errors) == {"label": "label must be at most 80 characters (got 300)"}
    assert client.list_runs() == []
    assert client.get_run(client.submit({"steps": 2}, label="y" * 80))["label"] == "y" * 80
