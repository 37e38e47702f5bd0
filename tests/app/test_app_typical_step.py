"""One-step views open on a typical step, never the traced final one; unmeasured spans stay NaN.

A hand-built 300-step DDP run shaped like the tour's (issue 33): every step 10-12 ms except the traced
ones (`should_trace_memory`: 0-2, every 200th, the last), 40 ms with `memory_traced`; the final step's
exposed comm 29 ms against 2 ms. The window keeps bucket events of steps 0, 1 and the newest 8.
"""

import math

import pytest

from ddpviz.app.frames import buckets as fb
from ddpviz.app.frames import detail
from ddpviz.app.frames import dp as fd
from ddpviz.app.frames import memory as fm
from ddpviz.app.frames import steps as fsteps
from ddpviz.app.frames.base import latest_complete_step
from ddpviz.engine.measure.memory_sampler import should_trace_memory

import eventgen as g

STEPS = 300
KEPT = [0, 1] + list(range(292, 300))


def _step_time(step: int) -> float:
    return 0.040 if should_trace_memory(step, STEPS) else 0.010 + 0.0002 * (step % 11)  # 10.0-12.0 ms


def _ddp_run(null_unsampled: bool = False) -> list[dict]:
    events = []
    for step in range(STEPS):
        traced = should_trace_memory(step, STEPS)
        for rank in range(2):
            events.append(dict(type="step", rank=rank, step=step, samples=64, step_time_s=_step_time(step),
                               forward_s=0.003, backward_s=0.005, optimizer_s=0.001,
                               comm_exposed_s=0.029 if step == STEPS - 1 else 0.002,
                               **({"memory_traced": True} if traced else {})))
            if step not in KEPT:
                continue
            sampled = traced or not null_unsampled
            for b in range(3):
                ready = 0.001 * (b + 1)
                end = 0.034 if step == STEPS - 1 and b == 2 else ready + 0.001
                events.append(dict(type="bucket", rank=rank, step=step, bucket_index=b, nbytes=4096,
                                   num_params=2, is_last=b == 2, sampled=traced if null_unsampled else None,
                                   ready_s=ready if sampled else None, comm_start_s=ready if sampled else None,
                                   comm_end_s=end if sampled else None))
    return events


def _median_steady_step(events) -> int:
    """The kept plain step nearest the median of the plain steps after warm-up (by hand)."""
    plain = [s for s in range(3, STEPS) if not should_trace_memory(s, STEPS)]
    times = sorted(_step_time(s) for s in plain)
    mid = len(times) // 2
    median = (times[mid - 1] + times[mid]) / 2 if len(times) % 2 == 0 else times[mid]
    kept = [s for s in KEPT if s in plain]
    return min(kept, key=lambda s: (abs(_step_time(s) - median), -s))


def test_bucket_view_opens_on_a_typical_step_not_the_traced_final_one():
    events = _ddp_run()
    buckets, steps = [e for e in events if e["type"] == "bucket"], [e for e in events if e["type"] == "step"]
    assert latest_complete_step(buckets, "bucket") == 299  # what the views opened on before
    chosen = detail.typical_detail_step(buckets, steps, "bucket")
    assert chosen == _median_steady_step(events) and chosen != 299
    frame = fb.bucket_frame(buckets, chosen)
    # the run's own exposed comm of that step (its step event's 2 ms; the band is the run's figure), not 31 ms
    assert fb.exposed_frame(frame, steps)["exposed_ms"].max() == pytest.approx(2.0)
    assert "instrumented" in detail.step_text(299, steps, buckets)
    assert "typical" in detail.step_text(chosen, steps, buckets)


def test_unsampled_steps_are_not_measured_never_zero():
    events = _ddp_run(null_unsampled=True)
    buckets, steps = [e for e in events if e["type"] == "bucket"], [e for e in events if e["type"] == "step"]
    frame = fb.bucket_frame(buckets, 295)
    assert len(frame) == 6 and frame[["ready_ms", "comm_start_ms", "comm_end_ms"]].isna().all().all()
    assert fb.measured_steps(buckets) == [0, 1, 299]  # the sampled ones, with their spans
    assert fsteps.step_notes(steps, buckets)[299] == "instrumented"
    nulls = [dict(e, comm_exposed_s=None) if e["step"] == 5 else e for e in steps]
    per_step = fb.exposed_per_step(nulls, "r").set_index("step")["exposed_ms"]
    assert math.isnan(per_step[5]) and per_step[6] == pytest.approx(2.0)


def test_with_spans_on_profiled_steps_only_the_view_opens_on_an_ordinary_step():
    """bucket_timing=recorder: every kept step has ready times and exposed comm, all-reduce spans
    only on the profiled (memory-traced, instrumented) steps. The view opens on the typical ordinary
    step, its all-reduce "not measured", not on an instrumented one for having spans (issue 33)."""
    events = []
    for e in _ddp_run():
        if e["type"] == "bucket" and not should_trace_memory(e["step"], STEPS):
            e = dict(e, comm_start_s=None, comm_end_s=None)
        events.append(e)
    buckets, steps = [e for e in events if e["type"] == "bucket"], [e for e in events if e["type"] == "step"]
    assert fb.measured_steps(buckets) == [0, 1, 299]  # the profiled ones
    chosen = detail.typical_detail_step(buckets, steps, "bucket")
    assert chosen == _median_steady_step(events)
    frame = fb.bucket_frame(buckets, chosen)
    assert frame["ready_ms"].notna().all() and frame["comm_end_ms"].isna().all()


def test_sampled_flag_alone_marks_a_step():
    buckets = [dict(type="bucket", rank=0, step=7, bucket_index=0, is_last=True, sampled=True,
                    ready_s=0.001, comm_start_s=0.001, comm_end_s=0.002)]
    assert fsteps.step_notes([], buckets) == {7: "sampled"}


def test_dp_phase_view_opens_on_a_typical_step():
    events = []
    for step in KEPT:
        evs = g.dp_step("r", step)
        for e in evs:
            if e["type"] == "step":
                e["step_time_s"] = _step_time(step)
                if should_trace_memory(step, STEPS):
                    e["memory_traced"] = True
        events += evs
    phases, steps = [e for e in events if e["type"] == "dp_phase"], [e for e in events if e["type"] == "step"]
    assert latest_complete_step(phases, "dp_phase") == 299
    chosen = detail.typical_detail_step(phases, steps, "dp_phase")
    assert chosen not in (0, 1, 299) and chosen == fd.typical_step(fd.dp_steps(phases), steps)


def test_memory_caption_holds_the_library_floor_apart():
    mib = 1024 * 1024
    events = [dict(type="memory", step=3, device=d, source="cuda", peak_allocated_bytes=floor + train,
                   allocated_bytes=floor, library_floor_bytes=floor, peak_training_bytes=train)
              for d, floor, train in (("cuda:0", 128 * mib, 3 * mib), ("cuda:1", 64 * mib, 1 * mib))]
    text = fm.peak_caption(fm.memory_peak_frame(events, "dp"))
    assert "3.00 MiB on cuda:0" in text and "library floor of 128 MiB" in text
    assert "max/min 3.00×" in text  # the training's 3 MiB / 1 MiB, not 131 / 65 = 2.02×


def test_memory_over_the_run_starts_at_zero_for_an_attached_run():
    # an attached run's rank 0 says run_started after its first step: its timer read memory before
    bins = [dict(device="cpu:0", source="process", first_ts=100.0 + t, last_ts=100.0 + t, mean_bytes=1e8,
                 lo_bytes=1e8, hi_bytes=1e8, readings=1, bin_s=0.5) for t in (-0.12, 0.4, 1.0)]
    df = fm.memory_over_run_frame(bins, "run", origin_ts=100.0)
    assert df["t_s"].min() == 0.0 and df["t_s"].max() == pytest.approx(1.12)


def test_a_step_with_starts_only_draws_marks_not_bars_and_says_so():
    # the flight recorder on gloo: bytes and enqueue time, no end (issue 31's unsampled steps)
    from ddpviz.app.charts.buckets import KINDS, bucket_timeline

    src = "flight recorder: bytes and enqueue time; all-reduce end not measured"
    events = [dict(type="bucket", rank=r, step=4, bucket_index=b, nbytes=4096, num_params=2, is_last=b == 1,
                   ready_s=None, comm_start_s=0.001 * (b + 1), comm_end_s=None, sampled=False, source=src)
              for r in range(2) for b in range(2)]
    steps = [dict(type="step", rank=r, step=4, samples=8, step_time_s=0.01, backward_s=0.004,
                  comm_exposed_s=None) for r in range(2)]
    names = fb.rank_names(steps + events)
    frame = fb.with_rank_names(fb.bucket_frame(events, 4), names)
    assert frame["comm_start_ms"].tolist() == pytest.approx([1.0, 2.0, 1.0, 2.0])
    assert frame["comm_end_ms"].isna().all() and frame["comm_ms"].isna().all()
    spec = bucket_timeline(frame, fb.with_rank_names(fb.backward_frame(steps, 4), names),
                           fb.with_rank_names(fb.exposed_frame(frame, steps), names), run="DDP").to_dict()
    marks = [layer for layer in spec["layer"] if (layer.get("mark") or {}).get("type") == "point"]
    assert len(marks) == 1 and marks[0]["encoding"]["x"]["field"] == "comm_start_ms"
    assert KINDS[4] in marks[0]["encoding"]["color"]["scale"]["domain"]
    assert "all-reduce ends not measured on this step (measured by flight recorder" in " ".join(spec["title"]["subtitle"])


def test_dp_timeline_prefers_steps_whose_gil_was_metered():
    gil = [dict(type="gil", step=s, device="cpu:0", gil_wait_share=0.1) for s in (0, 8, 16)]
    gil.append(dict(type="gil", step=24, device="cpu:0", gil_wait_share=None))  # a missing clock: not metered
    assert fd.metered_first([5, 8, 9, 16, 24], gil) == [8, 16]
    assert fd.metered_first([5, 9], gil) == [5, 9]  # none metered among them: every step stays
    assert fd.metered_first([5, 9], []) == [5, 9]


def test_a_chosen_step_far_from_the_median_says_so_with_both_times():
    """The view keeps only the newest steps; when they all ran slow (a machine that got busy at the
    end) the nearest of them is no typical step: by hand, steps 10-12 ms then the kept ones 20 ms
    (x2): the caption gives 20.0 ms against the run's median."""
    events = _ddp_run()
    for e in events:
        if e["type"] == "step" and e["step"] in KEPT[2:-1]:
            e["step_time_s"] = 0.020
    buckets, steps = [e for e in events if e["type"] == "bucket"], [e for e in events if e["type"] == "step"]
    chosen = detail.typical_detail_step(buckets, steps, "bucket")
    said = detail.step_text(chosen, steps, buckets)
    assert "20.0 ms against the run's median 11." in said and "typical" not in said


def test_live_and_the_bucket_page_open_on_the_same_typical_step_though_the_run_ended_slow():
    """The tour (issue 33): Live kept the newest two steps and opened on one of 9.1 ms against the
    run's median 5.0 ms; the Bucket timeline (the newest 8) on another. Both windows now keep the
    same steps across the run (`spread_stride`): by hand, of the kept steps the ordinary one nearest
    the median of steps 3-298, a 10-12 ms step, never one of the 20 ms steps that ended the run."""
    from ddpviz.app import runsets
    from ddpviz.app.window import RunWindow

    events = _all_steps_run()
    for e in events:
        if e["type"] == "step" and 288 < e["step"] < STEPS - 1:
            e["step_time_s"] = 0.020  # a machine that got busy at the end
    live, page = RunWindow("r"), RunWindow("r", max_steps=runsets.MAX_STEPS)
    for i in range(0, len(events), 50):
        live.ingest(events[i:i + 50])
        page.ingest(events[i:i + 50])
    on_live = detail.typical_detail_step(live.of_type("bucket"), live.of_type("step"), "bucket")
    on_page = fsteps.typical_step(detail.bucket_candidates(page.of_type("bucket"), page.of_type("step")),
                                  page.of_type("step"))
    times = {e["step"]: e["step_time_s"] for e in events if e["type"] == "step"}
    plain = sorted(times[s] for s in range(3, STEPS) if not should_trace_memory(s, STEPS))
    mid = len(plain) // 2
    median = (plain[mid - 1] + plain[mid]) / 2 if len(plain) % 2 == 0 else plain[mid]
    kept = {0, 1} | set(range(0, STEPS, 32)) | set(range(292, STEPS))
    plain_kept = [s for s in kept if not should_trace_memory(s, STEPS)]
    want = min(plain_kept, key=lambda s: (abs(times[s] - median), -s))
    assert on_live == on_page == want and times[want] < 0.0125
    assert "typical" in detail.step_text(on_live, live.of_type("step"), live.of_type("bucket"))


def _all_steps_run() -> list[dict]:
    """`_ddp_run`'s steps, with every step's bucket events (as a run sends them)."""
    events = []
    for e in _ddp_run():
        events.append(e)
        if e["type"] == "step" and e["step"] not in KEPT:
            events += [dict(type="bucket", rank=e["rank"], step=e["step"], bucket_index=b, nbytes=4096,
                            num_params=2, is_last=b == 2, ready_s=0.001 * (b + 1), comm_start_s=0.001 * (b + 1),
                            comm_end_s=0.001 * (b + 2)) for b in range(3)]
    return events


def test_past_its_window_live_still_leaves_the_sampled_first_steps_out():
    """bucket_timing=recorder, 700 steps: spans only on the traced steps (0-2, every 200th, the
    last), which say `sampled`. Live's window keeps 500 steps of step events, so steps 0 and 1 are
    no longer known as traced by their step events; their bucket events still say `sampled`. Seen in
    Chromium: Live opened on "Step 1 (sampled)" past step 500 (and the view re-drawn hid a tooltip)."""
    from ddpviz.app.window import RunWindow

    steps_n = 700
    events = []
    for step in range(steps_n):
        traced = should_trace_memory(step, steps_n)
        for rank in range(2):
            events.append(dict(type="step", rank=rank, step=step, samples=64,
                               step_time_s=0.010 + 0.0001 * (step % 7), forward_s=0.003, backward_s=0.005,
                               optimizer_s=0.001, comm_exposed_s=0.001,
                               **({"memory_traced": True} if traced else {})))
            events += [dict(type="bucket", rank=rank, step=step, bucket_index=0, nbytes=4096, num_params=2,
                            is_last=True, sampled=traced, ready_s=0.001, comm_start_s=0.001 if traced else None,
                            comm_end_s=0.002 if traced else None)]
    live = RunWindow("r")
    for i in range(0, len(events), 64):
        live.ingest(events[i:i + 64])
    assert min(e["step"] for e in live.of_type("step")) == 200
    assert {0, 1} <= set(fb.bucket_steps(live.of_type("bucket")))
    chosen = detail.typical_detail_step(live.of_type("bucket"), live.of_type("step"), "bucket")
    assert chosen >= 200 and not should_trace_memory(chosen, steps_n)
    assert "typical" in detail.step_text(chosen, live.of_type("step"), live.of_type("bucket"))


def test_a_step_without_measured_all_reduces_does_not_list_one_in_its_legend():
    """The tour (issue 33): a recorder step (ready times, exposed comm, no all-reduce spans) listed
    "all-reduce (a bar per bucket)" in its legend and drew none; a hook step lists and draws it."""
    from ddpviz.app.charts.buckets import KINDS, bucket_timeline

    def legend_of(spans: bool) -> list[str]:
        events = [dict(type="bucket", rank=r, step=4, bucket_index=0, nbytes=4096, num_params=2, is_last=True,
                       ready_s=0.001, comm_start_s=0.001 if spans else None, comm_end_s=0.002 if spans else None)
                  for r in range(2)]
        steps = [dict(type="step", rank=r, step=4, samples=8, step_time_s=0.01, backward_s=0.004,
                      comm_exposed_s=0.0005) for r in range(2)]
        names = fb.rank_names(steps + events)
        frame = fb.with_rank_names(fb.bucket_frame(events, 4), names)
        spec = bucket_timeline(frame, fb.with_rank_names(fb.backward_frame(steps, 4), names),
                               fb.with_rank_names(fb.exposed_frame(frame, steps), names), run="DDP").to_dict()
        domains = {tuple(layer["encoding"]["color"]["scale"]["domain"]) for layer in spec["layer"]
                   if "color" in layer.get("encoding", {})}
        assert len(domains) == 1  # one legend for every layer
        return list(domains.pop())

    assert legend_of(False) == [KINDS[0], KINDS[2], KINDS[3]]
    assert legend_of(True) == KINDS[:4]


def test_rare_long_waits_do_not_flatten_the_exposed_comm_chart_and_none_is_hidden():
    """The tour (issue 33): a few 50-100 ms exposed waits set a 0-100 ms axis over ~2 ms steps. By hand:
    300 steps of 1.0-2.9 ms (each tenth 15 times), 4 of them (steps 50, 120, 200, 260: none a 2.9 one)
    made 60-90 ms. Sorted, the 2.9s sit at 281-295 and the spikes at 296-299, so the 95th percentile
    (position 0.95 x 299 = 284.05) is 2.9 ms: the axis stops at 1.5 x 2.9 = 4.35 ms and the 4 are
    triangles at its top, their values in the tooltip and their count said."""
    import pandas as pd

    from ddpviz.app.charts.buckets import exposed_chart

    ms = [1.0 + 0.1 * (s % 20) for s in range(300)]
    spikes = {50: 60.0, 120: 90.0, 200: 75.0, 260: 80.0}
    per_step = pd.DataFrame({"run": "DDP", "step": range(300),
                             "exposed_ms": [spikes.get(s, v) for s, v in enumerate(ms)]})
    spec = exposed_chart(per_step, {"DDP": "ddp"}).to_dict()
    line, tops = spec["layer"]
    assert line["encoding"]["y"]["scale"]["domain"] == [0, pytest.approx(4.35)]
    rows = spec["datasets"][tops["data"]["name"]]
    assert sorted(r["step"] for r in rows) == sorted(spikes) and all(r["top"] == pytest.approx(4.35) for r in rows)
    assert "4 step(s) above it (up to 90.0 ms)" in " ".join(spec["title"]["subtitle"])
    calm = exposed_chart(per_step.assign(exposed_ms=ms), {"DDP": "ddp"}).to_dict()
    assert len(calm["layer"]) == 1 and "scale" not in calm["layer"][0]["encoding"]["y"]  # no spikes: no cap


def test_the_layout_caption_says_why_a_bucket_may_hold_more_than_its_cap():
    """The tour (issue 33): "cap 102 KiB" beside a 116.3 KiB bucket, unexplained. DDP closes a bucket
    with the tensor that takes it to its cap or past it (reducer.cpp, compute_bucket_assignment_by_size)."""
    first, second = fb.layout_captions({"initial": [{}], "rebuilt": [{}, {}], "bucket_cap_bytes": 104857,
                                        "first_bucket_cap_bytes": 1048576})
    assert "cap 102 KiB (first bucket 1,024 KiB)" in second and "may hold more than its cap" in second
