"""DP step bookkeeping without CUDA (engine/modes/dp/book.py), against hand-worked values.

Marks are plain numbers here (seconds on a made-up clock per device), so every expected span,
sum and byte count below is worked out by hand in the comments.
"""

import pytest
import torch

from ddpviz.engine.modes.dp.book import COMM_PHASES, Span, SpanBook, StarTraffic, phase_seconds, tensor_nbytes
from ddpviz.engine.modes.dp.book import theory_star_bytes, unique_tensors


def seconds_from(origins):
    return lambda device, mark: mark - origins[device]


def test_spans_are_kept_per_device_and_measured_from_that_devices_origin():
    # Device 0's clock origin is 100.0, device 1's is 500.0 (two devices, two event timelines).
    book = SpanBook()
    book.start("forward", 0, 0, 100.010)
    book.end("forward", 0, 0, 100.030)
    book.start("forward", 1, 0, 500.012)
    book.end("forward", 1, 0, 500.052)
    spans = book.resolve(seconds_from({0: 100.0, 1: 500.0}))
    assert [(s.device, round(s.start_s, 6), round(s.end_s, 6)) for s in spans] == \
        [(0, 0.010, 0.030), (1, 0.012, 0.052)]  # not one span copied to both devices


def test_each_micro_step_keeps_its_own_spans_and_the_step_sums_them():
    # grad_accum_steps = 2: forward on device 0 lasts 0.020 s then 0.030 s; summed: 0.050 s.
    book = SpanBook()
    for micro, (a, b) in enumerate([(0.010, 0.030), (0.100, 0.130)]):
        book.start("forward", 0, micro, a)
        book.end("forward", 0, micro, b)
    spans = book.resolve(seconds_from({0: 0.0}))
    assert [(s.micro, s.start_s, s.end_s) for s in spans] == [(0, 0.010, 0.030), (1, 0.100, 0.130)]
    assert phase_seconds(spans, ("forward",)) == pytest.approx(0.050)


def test_end_keeps_the_last_mark_and_start_the_first():
    # A replica's backward ends at the last parameter-gradient hook: marks 0.4, 0.7, 0.9 -> 0.9.
    book = SpanBook()
    book.start("backward", 1, 0, 0.2)
    book.start("backward", 1, 0, 0.3)  # a second start must not move it
    for m in (0.4, 0.7, 0.9):
        book.end("backward", 1, 0, m)
    (span,) = book.resolve(seconds_from({1: 0.0}))
    assert (span.start_s, span.end_s) == (0.2, 0.9)


def test_a_missing_end_is_an_error_naming_the_phase_and_device():
    book = SpanBook()
    book.start("reduce", 1, 0, 0.5)
    with pytest.raises(ValueError, match="'reduce' on device 1, micro-step 0 has no end"):
        book.resolve(seconds_from({1: 0.0}))


def test_spans_come_out_in_phase_order_within_a_micro_step():
    book = SpanBook()
    for phase, t in (("reduce", 5), ("forward", 2), ("broadcast", 0), ("backward", 4), ("scatter", 1)):
        book.start(phase, 0, 0, t)
        book.end(phase, 0, 0, t + 0.5)
    assert [s.phase for s in book.resolve(seconds_from({0: 0}))] == \
        ["broadcast", "scatter", "forward", "backward", "reduce"]


def test_exposed_comm_is_device_0s_time_in_the_four_copy_phases():
    # device 0: broadcast 0.1, scatter 0.2, forward 1.0, gather 0.3, reduce 0.4 (x2 micro-steps)
    # -> comm = 2 * (0.1 + 0.2 + 0.3 + 0.4) = 2.0; device 1's spans do not count.
    spans = []
    for micro in (0, 1):
        t = 10.0 * micro
        for phase, d in (("broadcast", 0.1), ("scatter", 0.2), ("forward", 1.0), ("gather", 0.3), ("reduce", 0.4)):
            spans.append(Span(phase, 0, micro, t, t + d))
            spans.append(Span(phase, 1, micro, t, t + 5 * d))
            t += d
    assert phase_seconds(spans, COMM_PHASES, device=0) == pytest.approx(2.0)
    assert phase_seconds(spans, ("forward",), device=1) == pytest.approx(10.0)


def test_tied_tensors_count_once():
    w = torch.zeros(10, 4)  # 160 bytes, appearing twice (embedding tied to the output layer)
    b = torch.zeros(10)  # 40 bytes
    assert unique_tensors([w, b, w, None]) == [w, b]
    assert tensor_nbytes([w, b, w, None]) == 200
    assert tensor_nbytes([torch.zeros(3, dtype=torch.bfloat16)]) == 6


def test_star_traffic_broadcast_scatter_gather_reduce_by_hand():
    # 3 devices. Broadcast 1000 B to each other device; scatter a 300 B batch as 100 B chunks;
    # gather 40 B outputs; reduce 1000 B of gradients from each other device.
    t = StarTraffic(3)
    t.from_hub("broadcast", 0, [1000, 1000, 1000])
    t.from_hub("scatter", 0, [100, 100, 100])
    t.to_hub("gather", 0, [40, 40, 40])
    t.from_hub(None, 0, [40, 40, 40])  # d loss / d outputs scattered back: totals only
    t.to_hub("reduce", 0, [1000, 1000, 1000])
    # device 0 sends 2*1000 + 2*100 + 2*40 = 2280, receives 2*40 + 2*1000 = 2080
    # devices 1, 2 send 40 + 1000 = 1040, receive 1000 + 100 + 40 = 1140
    assert t.sent == [2280, 1040, 1040]
    assert t.recv == [2080, 1140, 1140]
    assert t.span_nbytes[("broadcast", 0, 0)] == 2000 and t.span_nbytes[("broadcast", 2, 0)] == 1000
    assert t.span_nbytes[("reduce", 0, 0)] == 2000 and t.span_nbytes[("reduce", 1, 0)] == 1000
    assert t.span_nbytes[("gather", 0, 0)] == 80 and t.span_nbytes[("scatter", 1, 0)] == 100
    assert not any(k[0] is None for k in t.span_nbytes)


def test_star_traffic_adds_up_micro_steps_and_one_device_moves_nothing():
    t = StarTraffic(2)
    for micro in (0, 1):
        t.from_hub("broadcast", micro, [500, 500])
    assert t.sent == [1000, 0] and t.recv == [0, 1000]
    assert t.span_nbytes[("broadcast", 1, 0)] == 500 and t.span_nbytes[("broadcast", 1, 1)] == 500
    alone = StarTraffic(1)
    alone.from_hub("broadcast", 0, [500])
    alone.to_hub("reduce", 0, [500])
    assert alone.sent == [0] and alone.recv == [0]


def test_star_traffic_refuses_a_wrong_number_of_devices():
    with pytest.raises(ValueError, match="one byte count per device \\(2\\), got 3"):
        StarTraffic(2).to_hub("gather", 0, [1, 2, 3])


def test_theory_is_the_design_formula():
    # P = 1000 B, n = 4: device 0 (n-1)P = 3000, the others P
    assert theory_star_bytes(4, 1000) == [3000, 1000, 1000, 1000]
