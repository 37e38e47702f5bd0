"""`ddpviz run` stores and shows the command line with its secrets' values replaced (`workers.cli.command_env
.redacted`); the command itself runs with them. Reference: the arguments below, classified by hand."""

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


def test_the_commands_environment_carries_the_redacted_line(tmp_path):
    import json

    from ddpviz.engine.attach.env import COMMAND_ENV

    env = command_env("r", tmp_path, ["python", "t.py", "--api-key", "sk-live-1"])
    assert json.loads(env[COMMAND_ENV]) == ["python", "t.py", "--api-key", REDACTED]
    assert not [k for k, v in env.items() if "sk-live-1" in v]
