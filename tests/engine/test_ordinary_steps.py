"""A DDP rank's ordinary steps (CPU, one micro-batch, not metered, traced or sampled: e.g. 9, 10, 51,
`engine.modes.ddp.rank`'s `ordinary_step`) report what its fully marked steps do: the same step
fields, buckets and comm volume as the metered step 8 of the same run, and phases that fit inside
the step as the rank's own step starts bound it; comm_volume where the bytes can change."""

from __future__ import annotations

import pytest

from tests.engine.runs import train

CFG = dict(mode="ddp", world_size=2, model="mlp", width=64, depth=8, global_batch_size=16, steps=53,
           eval_every=0, probe=False, dataset="digits", device="cpu", bucket_cap_mb=0.01, optimizer="sgd", lr=0.01)
# step 7: metered (0-7, then one in 32), so marked in full; 8, 9, 10 and 51 neither traced nor metered
# (should_trace_memory: 0-2, every 200th, the last)
FULL, ORDINARY = 7, (8, 9, 10, 51)


@pytest.fixture(scope="module")
def events():
    _, sink = train(CFG)
    return sink.events


def _by(events, type_, rank, step):
    return [e for e in events if e["type"] == type_ and e.get("rank") == rank and e.get("step") == step]


@pytest.mark.parametrize("rank", [0, 1])
def test_ordinary_steps_report_the_fields_buckets_and_volume_of_a_fully_marked_step(events, rank):
    ref_step, = _by(events, "step", rank, FULL)
    ref_buckets = [b["nbytes"] for b in _by(events, "bucket", rank, FULL)]
    assert len(ref_buckets) > 1 and _by(events, "gil", rank, FULL)  # several buckets; step 8 is metered
    for step in ORDINARY:
        fields, = _by(events, "step", rank, step)
        assert set(fields) - {"ts"} == set(ref_step) - {"ts"}, step
        assert not _by(events, "gil", rank, step)
        buckets = _by(events, "bucket", rank, step)
        assert [b["nbytes"] for b in buckets] == ref_buckets
        assert all(b["ready_s"] is not None and 0 <= b["ready_s"] for b in buckets)
        # built from per-layout heads (rank's ordinary_finish), stamped once with the step event they come
        # with; every field but the step's own as the metered step's (LayoutBuckets.resolved, Telemetry.emit_many)
        assert {b["ts"] for b in buckets} == {fields["ts"]}, step
        own = {"ts", "step", "ready_s"}
        assert [{k: v for k, v in b.items() if k not in own} for b in buckets] == \
            [{k: v for k, v in b.items() if k not in own} for b in _by(events, "bucket", rank, FULL)]
        # DDP's rebuilt buckets are in gradient-ready order: each bucket ready no earlier than the one before
        readies = [b["ready_s"] for b in sorted(buckets, key=lambda b: b["bucket_index"])]
        assert readies == sorted(readies)
        # exposed comm = the backward's time after its last bucket was ready (engine.modes.ddp.rank.exposed_comm)
        whole_backward = fields["backward_s"] + fields["comm_exposed_s"]
        # every bucket was ready inside this step's backward, as timed by the rank's own clock around it (not
        # from the forward's start, nor the step's: the reducer's stamps minus the backward's start mark)
        assert readies[-1] <= whole_backward + 1e-6, (step, readies, whole_backward)
        assert fields["comm_exposed_s"] == pytest.approx(max(0.0, whole_backward - readies[-1]), abs=1e-9)


@pytest.mark.parametrize("rank", [0, 1])
def test_comm_volume_comes_on_the_traced_steps_and_says_the_buckets_bytes(events, rank):
    """Every step hands all-reduce the same bucket bytes once DDP rebuilt its buckets (after step 0), so
    comm_volume comes on the memory-traced steps (0-2 and the last in 53 steps: should_trace_memory) and where the
    sizes change, not on the steps between (engine.modes.ddp.rank.volume_due)."""
    volumes = {e["step"]: e for e in events if e["type"] == "comm_volume" and e["rank"] == rank}
    assert set(volumes) == {0, 1, 2, CFG["steps"] - 1}
    for step, volume in volumes.items():
        nbytes = sum(b["nbytes"] for b in _by(events, "bucket", rank, step))
        assert volume["allreduce_bytes"] == nbytes
        assert volume["sent_bytes"] == nbytes  # ring, 2 ranks: 2(n-1)/n = 1 byte per byte


@pytest.mark.parametrize("rank", [0, 1])
def test_a_steps_bucket_events_come_before_its_step_event(events, rank):
    """A step's detail events precede its step event in the stream (ordinary steps hand them over together)."""
    at = {(e["type"], e["step"], e.get("bucket_index")): i for i, e in enumerate(events)
          if e.get("rank") == rank and e["type"] in ("step", "bucket")}
    for step in (FULL, *ORDINARY):
        buckets = [i for (t, s, _), i in at.items() if t == "bucket" and s == step]
        assert buckets and max(buckets) < at[("step", step, None)]


@pytest.mark.parametrize("rank", [0, 1])
def test_only_the_memory_traced_steps_carry_sampled_bucket_spans(events, rank):
    traced = {e["step"] for e in events if e["type"] == "step" and e["rank"] == rank and e.get("memory_traced")}
    sampled = {e["step"] for e in events if e["type"] == "bucket" and e["rank"] == rank and e["sampled"]}
    assert traced == {0, 1, 2, CFG["steps"] - 1}  # should_trace_memory's steps in a 53-step run
    assert sampled == traced


@pytest.mark.parametrize("rank", [0, 1])
def test_ordinary_steps_phases_fit_inside_the_step_and_the_step_before_the_next_start(events, rank):
    starts = {e["step"]: e["start_ts"] for e in events if e["type"] == "step" and e["rank"] == rank}
    for step in ORDINARY:
        f, = _by(events, "step", rank, step)
        phases = f["forward_s"] + f["backward_s"] + f["comm_exposed_s"] + f["optimizer_s"]
        assert min(f["forward_s"], f["backward_s"], f["optimizer_s"]) > 0 and f["comm_exposed_s"] >= 0
        assert phases <= f["step_time_s"] + 1e-9
        assert f["step_time_s"] <= starts[step + 1] - starts[step]
        # the backward starts when the forward has ended: start + forward <= backward start
        assert f["start_ts"] + f["forward_s"] <= f["backward_start_ts"] + 1e-6
        assert f["backward_start_ts"] + f["backward_s"] + f["comm_exposed_s"] + f["optimizer_s"] \
            <= f["start_ts"] + f["step_time_s"] + 1e-6



@pytest.mark.usefixtures("field_plugins")
def test_a_nan_loss_on_an_ordinary_step_is_marked_and_fails_the_run_at_its_rank_and_step():
    """Step 9 is ordinary on every rank (not metered: 0-7, then one in 32; not traced in a 12-step run), so
    its events take the built-from-heads path: the NaN loss of rank 1 (whose shard holds the NaN sample
    there, field_models.bad_sample_data) is reported as null + "nan" in strict JSON, and the run fails there."""
    import json

    import field_models

    from ddpviz.engine.events import encode_json

    cfg = dict(mode="ddp", world_size=2, model="nanat9", global_batch_size=16, steps=12, eval_every=0,
               probe=False, device="cpu", optimizer="sgd", lr=0.1, step_delay_s=0.0)
    result, sink = train(cfg, must_succeed=False)
    assert result.status == "failed" and "loss is nan" in result.error["exception"]
    assert (result.error["rank"], result.error["step"]) == (field_models.BAD_RANK, 9)
    bad, = _by(sink.events, "step", field_models.BAD_RANK, 9)
    assert bad["loss"] is None and bad["loss_nonfinite"] == "nan"
    assert {b["ts"] for b in _by(sink.events, "bucket", field_models.BAD_RANK, 9)} == {bad["ts"]}  # the fast path
    for e in sink.events:
        json.loads(encode_json(e), parse_constant=lambda c: pytest.fail(f"{c} in {e['type']}"))


@pytest.mark.usefixtures("field_plugins")
def test_ordinary_steps_ready_times_are_those_pytorchs_own_gradient_hooks_saw(tmp_path, monkeypatch):
    """Independent reference: each parameter's post-accumulate-grad hook stamps when its gradient was ready
    (field_models.Stamped, in the rank process); a bucket's `ready_s` on an ordinary step is its last
    gradient's stamp minus the step's backward start (`backward_start_ts`). The model sleeps 4 ms in its
    forward and 6 ms in its backward between the two buckets, so a ready time counted from the step's or the
    forward's start, or a bucket's time given to the other, is off by >= 4 ms."""
    import statistics

    monkeypatch.setenv("DDPVIZ_TEST_STAMPS", str(tmp_path))
    cfg = dict(CFG, model="stamped", steps=16, width=None, depth=None, bucket_cap_mb=0.002)
    cfg = {k: v for k, v in cfg.items() if v is not None}
    _, sink = train(cfg)
    diffs = []
    for rank in (0, 1):
        stamps = [(line.split()[0].split(".")[0], float(line.split()[1]))
                  for line in (tmp_path / f"rank{rank}.txt").read_text().splitlines()]
        layout = {}  # bucket index -> its layer, from the events that named the bucket's parameters
        for b in sink.events:
            if b["type"] == "bucket" and b.get("rank") == rank and b.get("param_names"):
                layout[b["bucket_index"]] = {n.split(".")[0] for n in b["param_names"]}
        assert sorted(map(sorted, layout.values())) == [["first"], ["second"]]
        for step in range(8, 15):  # ordinary: not metered (0-7), not traced (0-2, the last)
            f, = _by(sink.events, "step", rank, step)
            begin = f["backward_start_ts"]
            end = begin + f["backward_s"] + f["comm_exposed_s"]
            for b in _by(sink.events, "bucket", rank, step):
                layer, = layout[b["bucket_index"]]
                ready = max(t for n, t in stamps if n == layer and begin <= t <= end + 1e-3)
                diffs.append((ready - begin) - b["ready_s"])
    assert len(diffs) == 28
    assert statistics.median(abs(d) for d in diffs) < 1e-3, diffs
    assert sum(abs(d) < 2e-3 for d in diffs) >= 24, diffs  # a preemption between the two stamps: rare
