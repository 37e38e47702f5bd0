"""`compare`: single, DP, DDP (and FSDP) on one config, side by side, with the numbers that explain them.

Speed-up is `samples_per_s(mode) / samples_per_s(single)` (median steady-state steps).
`max_param_diff_vs_single` is the largest absolute difference of any parameter after the run,
against the single-device run on the same global batches (0 up to float rounding when correct).
"""

from __future__ import annotations

from typing import Any, Callable

from ddpviz.engine.config import COMM_HOOK_FIELDS, FSDP_FIELDS, RunConfig
from ddpviz.engine.events import EventSink, ListSink
from ddpviz.engine.run import RunResult, run_training

MODES = ("single", "dp", "ddp")  # the default set
ALL_MODES = ("single", "dp", "ddp", "fsdp")
SPLIT = ("step_time_s", "forward_s", "backward_s", "comm_exposed_s", "optimizer_s")


def mode_report(result: RunResult, single: RunResult | None) -> dict[str, Any]:
    """One mode's entry of the comparison (see module docstring for the formulas)."""
    s = result.summary
    base = single.summary.get("samples_per_s") if single is not None else None
    sps = s.get("samples_per_s")
    diff = None
    if single is not None and result.final_params is not None and single.final_params is not None:
        diff = float((result.final_params - single.final_params).abs().max())
    return dict(status=result.status, error=result.error, samples_per_s=sps,
                speedup_vs_single=(sps / base) if sps and base else None,
                step_time_split={k: s.get(k) for k in SPLIT},
                comm_exposed_note=s.get("comm_exposed_note"),  # why comm_exposed_s is null, if it is
                peak_memory_bytes=s.get("peak_memory_bytes"), memory_imbalance=s.get("memory_imbalance"),
                bytes_per_device=s.get("bytes_per_device"), overlap=s.get("overlap"),
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


def compare(cfg: RunConfig, *, modes: tuple[str, ...] = MODES,
            sink_for: Callable[[str], EventSink] | None = None,
            on_mode: Callable[[str], None] | None = None) -> dict[str, dict[str, Any]]:
    """Run `cfg` in each of `modes` (in that order); returns a report keyed by mode.

    Args:
        cfg: the shared config; its `mode` is ignored.
        modes: a subset of `ALL_MODES`; `max_param_diff_vs_single` needs "single" among them.
        sink_for: sink for a mode's events (default: kept in memory and dropped).
        on_mode: called with each mode's name before it starts (progress display).

    Raises:
        ValueError: a mode not in `ALL_MODES`.
    """
    bad = [m for m in modes if m not in ALL_MODES]
    if bad:
        raise ValueError(f"modes must be among {list(ALL_MODES)} (got {bad})")
    results: dict[str, RunResult] = {}
    for mode in modes:
        if on_mode is not None:
            on_mode(mode)
        sink = sink_for(mode) if sink_for else ListSink()
        results[mode] = run_training(mode_config(cfg, mode), sink, f"compare-{mode}")
    single = results.get("single")
    single = single if single is not None and single.status == "succeeded" else None
    return {m: mode_report(results[m], single) for m in modes}
