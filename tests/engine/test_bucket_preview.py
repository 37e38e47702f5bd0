"""The bucket preview (PyTorch's assignment rule, before launch) matches the buckets a run reports."""

import pytest

from ddpviz.engine.config import RunConfig
from ddpviz.engine.events import ListSink
from ddpviz.engine.run import run_training

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("fields", [
    dict(model="mlp", width=64, depth=3, bucket_cap_mb=0.005),
    dict(model="gpt", dataset="text", width=32, depth=2, n_head=2, block_size=16, bucket_cap_mb=0.05),
    dict(model="mlp", width=64, depth=3),  # DDP's default cap: 1 MiB first bucket, one bucket here
], ids=["mlp-small", "gpt", "mlp-default-cap"])
def test_preview_matches_the_buckets_the_run_reports(fields):
    sink = ListSink()
    cfg = RunConfig(mode="ddp", global_batch_size=16, steps=3, eval_every=0, **fields)
    assert run_training(cfg, sink, "p").status == "succeeded"
    preview = sink.of_type("run_started")[0]["bucket_preview"]
    for step, layout in ((0, preview["initial"]), (1, preview["rebuilt"]), (2, preview["rebuilt"])):
        got = sorted((e for e in sink.of_type("bucket") if e["rank"] == 0 and e["step"] == step),
                     key=lambda e: e["bucket_index"])
        assert [e["nbytes"] for e in got] == [b["nbytes"] for b in layout], step
        assert [e["num_params"] for e in got] == [b["num_params"] for b in layout], step
    named = {e["bucket_index"]: e["param_names"] for e in sink.of_type("bucket")
             if e["rank"] == 0 and e["step"] == 1 and "param_names" in e}
    assert named == {b["bucket_index"]: b["param_names"] for b in preview["rebuilt"]}
