"""What the CLI stores and says: `ddpviz run` keeps the command line with its secrets' values replaced
(`workers.cli.command_env.redacted`; the command itself runs with them), and a missing run names the Redis asked
(`workers.cli.commands.no_run`). Reference: the arguments below, classified by hand."""

from __future__ import annotations

from ddpviz.workers.cli.command_env import REDACTED, command_env, redacted


def test_a_secrets_value_is_replaced_in_every_form_and_nothing_else_is():
    cmd = ["env", "HF_TOKEN=hf_abc", "torchrun", "--nproc-per-node", "2", "train.py", "--api-token", "tok123",
           "--wandb-key=wk456", "--tokenizer", "gpt2", "--keep", "3", "--use-auth", "--lr", "3e-4",
           "--password=", "OPENAI_API_KEY=sk-1", "model.hidden=64", "--secret"]
    assert redacted(cmd) == ["env", f"HF_TOKEN={REDACTED}", "torchrun", "--nproc-per-node", "2", "train.py",
                             "--api-token", REDACTED, f"--wandb-key={REDACTED}", "--tokenizer", "gpt2", "--keep", "3",
                             "--use-auth", "--lr", "3e-4", f"--password={REDACTED}", f"OPENAI_API_KEY={REDACTED}",
                             "model.hidden=64", "--secret"]
    assert cmd[7] == "tok123"  # the caller's list is left as it was: the command runs with its arguments
    urls = ["--url", "https://alice:S3cretPw@example.org/x", "--db=postgres://bob:pw%40x@db:5432/t",
            "https://example.org/a:b@c", "redis://:onlypw@h:6379/0"]
    assert redacted(urls) == ["--url", f"https://alice:{REDACTED}@example.org/x", f"--db=postgres://bob:{REDACTED}@db:5432/t",
                              "https://example.org/a:b@c", f"redis://:{REDACTED}@h:6379/0"]


def test_the_commands_environment_carries_the_redacted_line(tmp_path):
    import json

    from ddpviz.engine.attach.env import COMMAND_ENV

    env = command_env("r", tmp_path, ["python", "t.py", "--api-key", "sk-live-1"])
    assert json.loads(env[COMMAND_ENV]) == ["python", "t.py", "--api-key", REDACTED]
    assert not [k for k, v in env.items() if "sk-live-1" in v]


def test_a_missing_run_names_the_redis_asked_and_why_that_one(tmp_path, monkeypatch, redis_url, capsys):
    """A new user without their `ddpviz up` found (another DDPVIZ_HOME) read only "no run 'ID'" from the machine's
    own Redis; the message now names the Redis and says it is the default, and how to pick another."""
    import argparse

    from ddpviz.workers.cli.export import cmd_export
    from ddpviz.workers.connection import DEFAULT_URL, remove_up_url, url_and_source, write_up_url

    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.chdir(tmp_path)  # no .ddpviz/redis.url here
    url, source = url_and_source()
    assert url == DEFAULT_URL and source.startswith("the default: no running `ddpviz up` of this user found")
    write_up_url(redis_url)
    try:
        assert url_and_source() == (redis_url, url_and_source()[1]) and "running `ddpviz up`" in url_and_source()[1]
    finally:
        remove_up_url()
    assert url_and_source("redis://h:1/2") == ("redis://h:1/2", "--url")
    args = argparse.Namespace(run_id="n0such0run", url=redis_url, format="jsonl", out=None, dir=None)
    assert cmd_export(args) == 1
    assert f"no run 'n0such0run' in the Redis at {redis_url} (--url)" in capsys.readouterr().err


def test_an_output_path_that_cannot_be_written_is_refused_in_one_line(tmp_path, redis_client, redis_url, capsys):
    # a new user's `--out /nonexistent/x.jsonl` and `train --events /nonexistent/...` ended in FileNotFoundError
    # tracebacks (2026-12-06); train refuses before anything trains
    from ddpviz.workers.cli.commands import build_parser
    from ddpviz.workers.cli.exits import EXIT_REFUSED
    from ddpviz.workers.sink import RedisStreamWriter
    from ddpviz.workers.store import RunStore

    RunStore(redis_client).create("r1", {"mode": "ddp"})
    RedisStreamWriter(redis_client, "r1", 1000).write_batch([{"type": "run_started", "run_id": "r1", "ts": 1.0}])
    missing = tmp_path / "no" / "such" / "x.jsonl"
    args = build_parser().parse_args(["export", "r1", "--url", redis_url, "--out", str(missing)])
    assert args.handler(args) == EXIT_REFUSED
    assert f"refused: --out: cannot write {missing}: No such file or directory" in capsys.readouterr().err
    args = build_parser().parse_args(["train", "--steps", "1", "--events", str(missing)])
    assert args.handler(args) == EXIT_REFUSED
    assert f"refused: --events: cannot write {missing}" in capsys.readouterr().err


def test_a_server_that_accepts_but_never_answers_is_said_in_seconds(capsys):
    # a frozen Redis (SIGSTOP): `ddpviz runs` printed nothing for 300 s (30 s replies, retried), a new user 2026-12-06
    import socket
    import time

    import pytest

    from ddpviz.workers.cli.commands import main

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)  # connections are accepted by the kernel; nothing ever replies
        port = server.getsockname()[1]
        t0 = time.monotonic()
        with pytest.raises(SystemExit) as ended:
            main(["runs", "--url", f"redis://127.0.0.1:{port}/0"])
        took = time.monotonic() - t0
    assert ended.value.code == 2 and took < 20, took
    assert f"127.0.0.1:{port}" in capsys.readouterr().err
