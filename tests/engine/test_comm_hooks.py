"""Gradient compression (issue 25, item 6): PyTorch's comm hooks inside ddpviz's bucket recording,
each beside plain DDP with the same hook on 2 gloo ranks (same model, seed and batches).

The reference counts its bytes itself (a wrapper of `dist.all_reduce` in the plain process,
`plain_ddp._register_hook`); ddpviz's come from its `bucket` events.
"""

from __future__ import annotations

import pytest
import runs
import torch

from ddpviz.engine.config import ConfigError, RunConfig, validate_config

FAST = dict(mode="ddp", world_size=2, global_batch_size=16, eval_every=0, step_delay_s=0.0, lr=0.1,
            optimizer="sgd", probe=False, steps=4)
MODEL_BYTES = (64 * 32 + 32 + 32 * 10 + 10) * 4  # Outputs: Linear(64, 32), Linear(32, 10) = 9,640 B


pytestmark = pytest.mark.usefixtures("field_plugins")


def cfg_of(**fields) -> RunConfig:
    return validate_config({**FAST, "model": "tupleout", **fields})


def run(cfg: RunConfig):
    return runs.train(cfg, f"hook-{cfg.comm_hook}", must_succeed=False)


def bucket_bytes(sink, rank: int) -> list[int]:
    """Per step, the bytes rank `rank`'s buckets handed to all-reduce (bucket events)."""
    steps = sorted({e["step"] for e in sink.of_type("bucket")})
    return [sum(e["nbytes"] for e in sink.of_type("bucket") if e["rank"] == rank and e["step"] == s)
            for s in steps]


@pytest.mark.slow
@pytest.mark.parametrize("hook,fields", [("fp16", {}), ("powersgd", {"start_powerSGD_iter": 2})])
def test_a_compressing_hook_sends_what_plain_ddp_sends_and_trains_like_it(hook, fields):
    from plain_ddp import plain_ddp

    cfg = cfg_of(comm_hook=hook, **fields)
    ref = plain_ddp(cfg)
    result, sink = run(cfg)
    assert result.status == "succeeded", result.error
    for rank in (0, 1):
        assert bucket_bytes(sink, rank) == ref["wire_bytes"][rank], rank
    torch.testing.assert_close(result.final_params, ref["params"], rtol=1e-5, atol=1e-6)
    last = [e for e in sink.of_type("bucket") if e["step"] == cfg.steps - 1]
    for e in last:
        assert e["uncompressed_nbytes"] == MODEL_BYTES and e["comm_hook"].endswith("hook")
        assert e["compression_ratio"] == pytest.approx(MODEL_BYTES / e["nbytes"])
        assert e["nonfinite_after_reduce"] is False
        assert e["comm_start_s"] <= e["comm_end_s"]
    if hook == "fp16":  # the figure: fp16 halves the wire bytes, 9,640 -> 4,820 B
        assert ref["wire_bytes"][1] == [MODEL_BYTES // 2] * cfg.steps
        assert {e["wire_dtype"] for e in last} == {"float16"}
    else:  # plain all-reduce until start_powerSGD_iter, then P and Q factors of rank 1
        assert ref["wire_bytes"][1][:2] == [MODEL_BYTES] * 2
        assert ref["wire_bytes"][1][2] < MODEL_BYTES / 10
        assert {e["collectives"] for e in last} == {3}  # uncompressed tensors, Ps, Qs
    volume = [e for e in sink.of_type("comm_volume") if e["step"] == cfg.steps - 1 and e["rank"] == 1][0]
    assert volume["allreduce_bytes"] == ref["wire_bytes"][1][-1]
    assert "handed to all-reduce" in volume["volume_source"]


@pytest.mark.slow
def test_fp16_overflow_after_the_reduce_is_flagged_like_plain_ddp_sees_it():
    from plain_ddp import plain_ddp

    cfg = validate_config({**FAST, "model": "bigx", "comm_hook": "fp16", "steps": 2})
    ref = plain_ddp(cfg)
    assert ref["grads_finite"][0][0] is False  # plain DDP + fp16: gradients beyond 65504 become inf
    result, sink = run(cfg)
    step0 = [e for e in sink.of_type("bucket") if e["step"] == 0]
    assert step0 and all(e["nonfinite_after_reduce"] is True for e in step0)
    assert result.status == "failed" and "loss is nan" in result.error["exception"]


def test_bf16_on_gloo_is_refused_before_launch_quoting_torch():
    from ddpviz.engine.modes.ddp.comm_hooks import TORCH_BF16_REFUSAL

    with pytest.raises(ConfigError) as exc:  # backend named: refused by the config itself
        validate_config({**FAST, "comm_hook": "bf16", "backend": "gloo"})
    assert exc.value.errors[0][0] == "comm_hook" and "bf16_compress_hook on gloo" in str(exc.value)
    result, sink = run(validate_config({**FAST, "comm_hook": "bf16"}))  # auto -> gloo on CPU
    err = result.error
    assert result.status == "failed" and err["stage"] == "pre-flight"
    assert err["exception"].startswith("comm_hook: comm_hook 'bf16' needs backend 'nccl'")
    assert TORCH_BF16_REFUSAL in err["exception"]
    assert [e["type"] for e in sink.events] == ["run_finished"]


def test_powersgd_on_gloo_with_two_buckets_is_refused_before_launch_not_left_to_hang():
    """PyTorch's powerSGD_hook hangs on gloo once DDP's gradients span two buckets (comm_hooks' module docstring:
    plain torch, no ddpviz, stopped at its first compressed step every time): refused in pre-flight, naming the
    field, the bucket count from DDP's own assignment rule and a cap that gives one bucket, which then trains."""
    import re

    cfg = {**FAST, "comm_hook": "powersgd", "bucket_cap_mb": 0.1}
    result, sink = run(validate_config(cfg))
    err = result.error
    assert result.status == "failed" and err["stage"] == "pre-flight", err
    assert err["exception"].startswith("comm_hook: comm_hook 'powersgd' on gloo needs DDP's gradients in one bucket")
    assert [e["type"] for e in sink.events] == ["run_finished"]
    from ddpviz.engine.components.preflight import probe_batch
    from ddpviz.engine.data import load_dataset
    from ddpviz.engine.models import build_model
    from ddpviz.engine.modes.ddp.buckets import preview_buckets

    c = RunConfig(**cfg)
    ds = load_dataset(c)
    n = len(preview_buckets(c, build_model(c, ds), *probe_batch(c, ds))["rebuilt"])
    assert n >= 2 and f"would be in {n} (bucket_cap_mb=0.1" in err["exception"]
    cap = int(re.search(r"Use bucket_cap_mb=(\d+)", err["exception"]).group(1))
    result, sink = run(validate_config({**cfg, "bucket_cap_mb": cap}))
    assert result.status == "succeeded", result.error


@pytest.mark.slow
def test_torch_itself_refuses_bf16_hook_on_gloo():
    """The quoted words are PyTorch's: DDP's register_comm_hook on a gloo group."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddpviz.engine.modes.ddp.comm_hooks import TORCH_BF16_REFUSAL
    from ddpviz.engine.modes.launcher import free_port
    from ddpviz.engine.modes.ranks import join_process_group, leave_process_group

    # the store's address in the call, not in os.environ: a MASTER_PORT left there would outlive
    # this test in the process (tests/engine/test_rank_environ.py)
    join_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        ddp = DDP(torch.nn.Linear(2, 2))
        with pytest.raises(TypeError, match=TORCH_BF16_REFUSAL.replace("+", r"\+")):
            ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
    finally:
        leave_process_group()


@pytest.mark.parametrize("fields,field", [
    (dict(mode="dp", comm_hook="fp16"), "comm_hook"),
    (dict(comm_hook="fp16", overlap=False), "overlap"),
    (dict(matrix_approximation_rank=2), "matrix_approximation_rank"),
    (dict(comm_hook="powersgd", start_powerSGD_iter=1), "start_powerSGD_iter"),
])
def test_comm_hook_settings_that_cannot_run_name_their_field(fields, field):
    with pytest.raises(ConfigError) as exc:
        validate_config({**FAST, **fields})
    assert field in [f for f, _ in exc.value.errors]


def test_composing_with_a_users_own_hook_counts_what_it_hands_to_all_reduce():
    """The wrapper another hook (a user's) goes through: one gloo rank, a hook that all-reduces a
    quarter of the bucket in fp16 (bytes 1/8 of the bucket's) and restores it."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddpviz.engine.modes.ddp.comm_hook import BucketRecorder, recording_hook
    from ddpviz.engine.modes.ddp.comm_hooks import compose
    from ddpviz.engine.modes.launcher import free_port
    from ddpviz.engine.modes.ranks import join_process_group, leave_process_group

    def quarter_hook(state, bucket):
        buf = bucket.buffer()
        part = buf[: buf.numel() // 4].to(torch.float16)
        fut = dist.all_reduce(part, async_op=True).get_future()
        return fut.then(lambda f: buf)

    # the store's address in the call, not in os.environ: a MASTER_PORT left there would outlive
    # this test in the process (tests/engine/test_rank_environ.py)
    join_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        model = torch.nn.Linear(16, 16)
        ddp = DDP(model)
        rec = BucketRecorder(1, True, {p.data_ptr(): n for n, p in model.named_parameters()}, predivided=True)
        compose(rec, quarter_hook, None, name="quarter")
        assert rec.predivided is False
        ddp.register_comm_hook(rec, recording_hook)
        rec.begin_backward()
        ddp(torch.ones(2, 16)).sum().backward()
        (b,) = rec.resolved()
        grad_bytes = (16 * 16 + 16) * 4
        assert (b["uncompressed_nbytes"], b["nbytes"]) == (grad_bytes, grad_bytes // 4 // 2)
        assert (b["comm_hook"], b["wire_dtype"], b["collectives"]) == ("quarter", "float16", 1)
        assert b["compression_ratio"] == 8.0 and b["nonfinite_after_reduce"] is False
    finally:
        leave_process_group()


def test_the_cli_flags_carry_the_comm_hook_fields():
    import argparse

    from ddpviz.workers.cli.flags import add_run_flags, run_fields

    parser = argparse.ArgumentParser()
    add_run_flags(parser)
    args = parser.parse_args(["--comm-hook", "powersgd", "--matrix-approximation-rank", "2",
                              "--start-powerSGD-iter", "5"])
    cfg = validate_config({**FAST, **run_fields(args)})
    assert (cfg.comm_hook, cfg.matrix_approximation_rank, cfg.start_powerSGD_iter) == ("powersgd", 2, 5)
