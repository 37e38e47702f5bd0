"""Theory and Scale-out speak of the run's own backend and world size (issue 33.4): no "gloo",
"loopback" or "the other rank" for a one-rank NCCL run, no bandwidth for a one-rank all-reduce
(it moves nothing), and no DP result Scale-out did not model."""

from __future__ import annotations

import json


from ddpviz.app.frames import scaleout as fso
from ddpviz.app.frames import theory as ft

GLOO_WORDS = ("gloo", "loopback")


def test_link_note_follows_backend_and_world_size():
    one = ft.link_note("nccl", 1)
    assert "moves no bytes" in one and not any(w in one.lower() for w in GLOO_WORDS + ("other rank",))
    nccl = ft.link_note("nccl", 2)
    assert "NCCL" in nccl and not any(w in nccl.lower() for w in GLOO_WORDS)
    assert "loopback" in ft.link_note("gloo", 2)
    assert "2 hosts" in ft.link_note("nccl", 8, nnodes=2)


def test_bucket_and_fit_words_follow_backend_and_world_size():
    counts = dict(timed=10, warmup=1, overlapped=2, used=7)
    assert "gloo" not in ft.bucket_note(None, counts, 2, "nccl")
    assert "ProcessGroupGloo" in ft.bucket_note(None, counts, 2, "gloo")
    flat = dict(s_per_byte=0.0, latency_s=0.001)
    assert "the other ranks" in ft.describe_fit(flat, 4) and "the other rank " in ft.describe_fit(flat, 2) + " "
    assert "the other ranks" in ft.ratio_note(dict(median_alone=0.8, n_alone=3, median_all=None), 4)


def _prediction(mode: str, n: int, sps: float) -> dict:
    return dict(mode=mode, world_size=n, samples_per_s=sps, efficiency=0.9, step_time_s=0.01,
                comm_exposed_s=0.001, comm_s=0.001, bytes_per_rank=1e6, device0_bytes=1e6)


def test_scaleout_states_no_dp_result_it_did_not_model():
    only_ddp = {"predictions": [_prediction("ddp", n, 100.0 * n) for n in (1, 2, 4)]}
    text = fso.crossover_text(only_ddp)
    assert "DP not modelled" in text and "pull ahead" not in text
    both = {"predictions": [_prediction("ddp", n, 100.0 * n) for n in (1, 2, 4)]
            + [_prediction("dp", n, 90.0 * n if n < 2 else 50.0 * n) for n in (1, 2, 4)]}
    assert fso.crossover_text(both) == "Predicted: DDP's samples/s pulls ahead of DP's from n = 2 on."
    assert not any(w in fso.this_machine_means("nccl") for w in GLOO_WORDS)
    assert "gloo over loopback" in fso.this_machine_means("gloo")


def _one_rank_nccl_run(client) -> str:
    ts = 1_700_000_000.0
    started = dict(type="run_started", run_id="nccl1", ts=ts, backend="nccl", world_size=1,
                   config=dict(mode="ddp", world_size=1))
    events = [started]
    for step in range(4):
        events.append(dict(type="step", run_id="nccl1", ts=ts + step, rank=0, step=step, samples=32,
                           step_time_s=0.01, forward_s=0.003, backward_s=0.004, comm_exposed_s=0.0005,
                           optimizer_s=0.001))
        for b in range(2):
            events.append(dict(type="bucket", run_id="nccl1", ts=ts + step, rank=0, step=step, bucket_index=b,
                               nbytes=20000, num_params=2, ready_s=0.001 * (b + 1), comm_start_s=0.001 * (b + 1),
                               comm_end_s=0.001 * (b + 1) + 0.0002, is_last=b == 1))
    return client.add_run("nccl1", {"mode": "ddp", "world_size": 1}, status="succeeded", events=events,
                          started=started)


def test_theory_page_for_a_one_rank_nccl_run(fake_client, app_test):
    _one_rank_nccl_run(fake_client)
    at = app_test("views/theory.py")
    assert not at.exception, [e.value for e in at.exception]
    text = " ".join(str(x.value) for kind in ("info", "caption", "markdown") for x in getattr(at, kind)).lower()
    assert "moves no bytes" in text
    assert not any(w in text for w in GLOO_WORDS + ("the other rank",)), text
    titles = [json.loads(c.proto.spec).get("title") for c in at.get("vega_lite_chart")]
    assert not any("bandwidth" in json.dumps(t) for t in titles)


def test_the_in_run_over_probe_ratio_says_when_it_rests_on_few_buckets_and_what_above_1_means():
    """A fresh user read "median 1.65x over 4 buckets" as a property of the link; the note now says a median of
    fewer than 8 buckets is rough, and what a ratio above 1 means, not only below."""
    few = ft.ratio_note(dict(median_alone=1.65, n_alone=4, median_all=None), 2)
    many = ft.ratio_note(dict(median_alone=1.65, n_alone=20, median_all=None), 2)
    assert "Only 4 bucket(s): a rough figure" in few and "rough" not in many
    assert "above 1, the probe's own all-reduce was slower" in many

