"""`compare`: single, DP, DDP (and FSDP) on one config, side by side, with the numbers that explain them.

Speed-up is `samples_per_s(mode) / samples_per_s(single)` (median steady-state steps).
`max_param_diff_vs_single` is the largest absolute difference of any parameter after the run,
against the single-device run on the same global batches (0 up to float rounding when correct).
With Adam/AdamW (the default optimizer) that rounding grows with the steps: Adam divides each
update by the root of its running squared gradient, so a last-bit difference in a near-zero
gradient becomes a step of up to `lr`. Measured on the default config (2026-12-05): DP and DDP
3.4e-7 at 10 steps, 6.0e-7 at 50, 0.036 at 150, 0.19 at 300 (validation accuracy 0.546 against
single's 0.584); with SGD (lr 0.05) 3.0e-8 at 150. Judge the math on the first steps or with SGD
(tests/engine/test_correctness.py: SGD, 4-52 steps).
"""

from __future__ import annotations

from typing import Any, Callable

from ddpviz.engine.config import COMM_HOOK_FIELDS, FSDP_FIELDS, RunConfig
from ddpviz.engine.events import EventSink, ListSink
from ddpviz.engine.run import RunResult, run_training

MODES = ("single", "dp", "ddp")  # the default set
ALL_MODES = ("single", "dp", "ddp", "fsdp")
SPLIT = ("step_time_s", "forward_s", "backward_s", "comm_exposed_s", "optimizer_s")


def mode_report(result: RunResult, single: RunResult | None, mode: str | None = None) -> dict[str, Any]:
    """One mode's entry of the comparison (see module docstring for the formulas). `comm_part` names what
    its `comm_exposed_s` is: DP's copies through device 0, or the other modes' exposed comm
    (`engine.summary.comm_part`); single's is null, `comm_exposed_note` saying why (it talks to nobody)."""
    from ddpviz.engine.summary import NO_COMM_ONE_DEVICE, comm_part

    s = result.summary
    split = {k: s.get(k) for k in SPLIT}
    note = s.get("comm_exposed_note")  # why comm_exposed_s is null, if it is
    if mode == "single":  # its 0.0 is a constant: no communication was measured, none exists
        split["comm_exposed_s"], note = None, NO_COMM_ONE_DEVICE
    base = single.summary.get("samples_per_s") if single is not None else None
    sps = s.get("samples_per_s")
    diff = None
    if single is not None and result.final_params is not None and single.final_params is not None:
        diff = float((result.final_params - single.final_params).abs().max())
    return dict(status=result.status, error=result.error, samples_per_s=sps,
                speedup_vs_single=(sps / base) if sps and base else None,
                step_time_split=split, comm_part=comm_part(mode), comm_exposed_note=note,
                peak_memory_bytes=s.get("peak_memory_bytes"), memory_imbalance=s.get("memory_imbalance"),
                bytes_per_device=s.get("bytes_per_device"), overlap=s.get("overlap"),
                overlap_note=s.get("overlap_note"),  # why overlap is null, if it is (bucket_timing=recorder)
                replicas_in_sync=s.get("replicas_in_sync"), max_param_diff_vs_single=diff,
                val_accuracy=s.get("val_accuracy"), final_loss=s.get("final_loss"),
                gil_wait_share=s.get("gil_wait_share"), gil_wait_s=s.get("gil_wait_s"),
                gil_source=s.get("gil_source"), dp_phase_s=s.get("dp_phase_s"),
                # what the verdict's interval and parts are computed from (engine.verdict)
                dp_phase_mean_s=s.get("dp_phase_mean_s"), steady_mean_s=s.get("steady_mean_s"),
                steady_samples_per_s=s.get("steady_samples_per_s"))


def report_verdict(report: dict[str, dict[str, Any]]):
    """`engine.verdict.verdict` of a comparison's DP and DDP entries (None without both, or before
    either has `engine.verdict.MIN_STEADY_STEPS` steady steps)."""
    from ddpviz.engine.verdict import verdict

    def flat(mode: str) -> dict[str, Any] | None:
        r = report.get(mode)
        return None if r is None else {**r, **(r.get("step_time_split") or {})}

    return verdict(flat("dp"), flat("ddp"))


def mode_config(cfg: RunConfig, mode: str) -> RunConfig:
    """`cfg` as `mode`; the FSDP-only knobs go back to their defaults for the other modes, and the
    DDP-only comm hook knobs for modes other than ddp."""
    update: dict[str, Any] = {"mode": mode}
    if mode != "fsdp":
        update.update({k: RunConfig.model_fields[k].default for k in FSDP_FIELDS})
    if mode != "ddp":
        update.update({k: RunConfig.model_fields[k].default for k in COMM_HOOK_FIELDS})
    return RunConfig(**{**cfg.model_dump(), **update})


def in_turns(cfg: RunConfig, modes: tuple[str, ...], block_steps: int,
             sink_for: Callable[[str], EventSink] | None = None) -> dict[str, RunResult]:
    """Every mode's run started at once, training `block_steps` steps at a time in turns, the order
    rotated each round (`engine.harness.interleaved.run_in_turns`), so the modes are measured at
    the same moments of the machine: its drift (on a shared 2-core VM the same loop's step time
    moves 30-60% over seconds) falls on every mode alike instead of on whichever ran later. Step
    times exclude the waits for a turn (the gate is between steps, `engine.components.loop.drive`).

    Each result's summary is built from its events (`engine.summary.SummaryBuilder`, as for a run
    on its own); `final_params` is None (the runs' processes keep their parameters), so
    `max_param_diff_vs_single` is null in this mode.

    Raises:
        ValueError: `cfg.steps` is not a multiple of `block_steps`, or `block_steps` < 2.
        RuntimeError: a run did not succeed (its run id and error).
    """
    from ddpviz.engine.harness.interleaved import run_in_turns
    from ddpviz.engine.summary import SummaryBuilder

    if block_steps < 2 or cfg.steps % block_steps:
        raise ValueError(f"turns must be >= 2 and divide steps={cfg.steps} (got turns={block_steps})")
    got = run_in_turns({f"compare-{m}": mode_config(cfg, m) for m in modes}, block_steps)
    results: dict[str, RunResult] = {}
    for mode in modes:
        builder, sink = SummaryBuilder(), sink_for(mode) if sink_for else None
        for e in got[f"compare-{mode}"]:
            builder.observe(e)
            if sink is not None:
                sink.emit(e)
        results[mode] = RunResult(status="succeeded", summary=builder.summary())
    return results


def compare(cfg: RunConfig, *, modes: tuple[str, ...] = MODES,
            sink_for: Callable[[str], EventSink] | None = None,
            on_mode: Callable[[str], None] | None = None, turns: int | None = None) -> dict[str, dict[str, Any]]:
    """Run `cfg` in each of `modes` (in that order, or all at once taking turns of `turns` steps:
    `in_turns`); returns a report keyed by mode.

    Args:
        cfg: the shared config; its `mode` is ignored.
        modes: a subset of `ALL_MODES`; `max_param_diff_vs_single` needs "single" among them (and
            runs one after another).
        sink_for: sink for a mode's events (default: kept in memory and dropped).
        on_mode: called with each mode's name before it starts (progress display; with `turns`,
            once with every mode's name).
        turns: steps per turn, or None for one run after another.

    Raises:
        ValueError: a mode not in `ALL_MODES`; `turns` that does not divide the steps.
        RuntimeError: with `turns`, a run that did not succeed.
    """
    bad = [m for m in modes if m not in ALL_MODES]
    if bad:
        raise ValueError(f"modes must be among {list(ALL_MODES)} (got {bad})")
    results: dict[str, RunResult] = {}
    if turns is not None:
        if on_mode is not None:
            on_mode(f"{', '.join(modes)} at once, taking turns of {turns} steps")
        results = in_turns(cfg, modes, turns, sink_for)
    else:
        for mode in modes:
            if on_mode is not None:
                on_mode(mode)
            sink = sink_for(mode) if sink_for else ListSink()
            results[mode] = run_training(mode_config(cfg, mode), sink, f"compare-{mode}")
    single = results.get("single")
    single = single if single is not None and single.status == "succeeded" else None
    return {m: mode_report(results[m], single, m) for m in modes}
