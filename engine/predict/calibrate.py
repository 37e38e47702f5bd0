"""Calibration of the scale-out predictor from a set's single-device baseline: the contention
term κ (a DDP rank beside others against a device alone), the share f of compute that does
not grow with the batch, and the compute's own contention κ_c where κ cannot explain the forward.
Pure Python (no torch); `engine.predict.scaleout` uses them (see its module doc and docs/predict.md).
"""

from __future__ import annotations

from ddpviz.engine.predict.inputs import RunInputs
from ddpviz.engine.predict.step_models import time_share


def same_device_size(single: RunInputs, run: RunInputs) -> bool:
    """Whether the single baseline and `run` ran on devices of one size: the same kind and the same
    threads per device (the condition every calibration here needs to compare their times)."""
    return (single.device_kind, single.cpu_threads_per_device) == (run.device_kind, run.cpu_threads_per_device)


def unlike(single: RunInputs, run: RunInputs) -> str:
    """What sets the single baseline apart from `run`, in words (device kind, threads per device, global batch,
    a run on one device), for the calibration's "not used" notes: a new user read "a different device size or batch"
    beside a baseline of the same batch, not knowing it had run with 2 threads against the ranks' 1 (2026-12-06)."""
    said = []
    if single.device_kind != run.device_kind:
        said.append(f"{single.device_kind} against this run's {run.device_kind}")
    elif single.cpu_threads_per_device != run.cpu_threads_per_device:
        said.append(f"{single.cpu_threads_per_device} CPU thread(s) a device against this run's "
                    f"{run.cpu_threads_per_device}")
    if single.global_batch_size != run.global_batch_size:
        said.append(f"global batch {single.global_batch_size} against {run.global_batch_size}")
    if run.world_size < 2:
        said.append("this run has one device")
    return "; ".join(said) or "same device size and batch"


def contention(single: RunInputs | None, run: RunInputs) -> tuple[float, str]:
    """κ: how much slower a DDP rank's work runs beside the other ranks of its CPU host than the
    same work on a device alone.

    Read from the one part of the step that is the same work in both runs: the optimizer step
    (the same parameters and optimizer, whatever the batch), so κ = the rank's median
    `optimizer_s` / (the single baseline's × k(n_m)) on devices of the same size, k being the
    time-share of ranks that outnumber the cores (`time_share`; 1 while they fit), which the
    model already applies on its own. Ranks beside each other share memory bandwidth and caches
    and the other ranks' gloo threads; a device alone does not. Clipped below at 1 (beside
    others is never faster; a smaller ratio is noise).

    Returns:
        (κ, source in words); (1.0, why) without a usable DDP run and baseline.
    """
    if single is None or single.mode != "single" or run.mode != "ddp" or run.world_size < 2:
        return 1.0, "no DDP run beside a single-device baseline: no contention term (κ = 1)"
    if not same_device_size(single, run) or run.device_kind != "cpu":
        return 1.0, "the single baseline ran on a different device size (or not on CPU): κ = 1"
    if not run.host_cpu_count:
        return 1.0, "the run does not say how many cores its host has (an older recording): κ = 1"
    if not (single.optimizer_s > 0 and run.optimizer_s > 0):
        return 1.0, "no optimizer time in the runs: κ = 1"
    shared = time_share_of(run)
    k = max(1.0, run.optimizer_s / (single.optimizer_s * shared))
    return k, (f"optimizer step of DDP rank {run.run_id} beside {run.world_size - 1} other(s) "
               f"{run.optimizer_s * 1e3:.3f} ms against the single baseline {single.run_id} alone "
               f"{single.optimizer_s * 1e3:.3f} ms"
               + (f" × the time-share {shared:g}" if shared != 1 else "") + f": κ = {k:.2f}")


def time_share_of(run: RunInputs) -> float:
    """k(n_m) of a CPU run (1 elsewhere or without a core count)."""
    if run.device_kind != "cpu" or not run.host_cpu_count:
        return 1.0
    return time_share(run.world_size, run.host_cpu_count)


def fixed_fraction(single: RunInputs | None, run: RunInputs, kappa: float = 1.0) -> tuple[float, str]:
    """Share f of the run's per-device compute that does not grow with the batch.

    Two points on one line: the single-device baseline's forward over the global batch B and a
    device's forward over B/n_m in `run`, both on devices of the same size (same threads, same
    kind), the run's divided by `kappa` (`contention`: its forward ran beside other ranks, the
    baseline's alone) and by its time-share k(n_m) (`time_share`: 1 while the devices fit the
    cores): c(b) = c0 + c1·b, f = c0 / c(b_m), clipped to [0, 1]. Forward only: a DDP
    rank's backward has the all-reduces' CPU work interleaved (gloo), which is not compute.

    Returns:
        (f, source in words); (0.0, why) when no usable baseline is given.
    """
    if single is None or single.mode != "single":
        return 0.0, "no single-device baseline in this set: all compute taken as proportional to the batch"
    if not same_device_size(single, run) or single.global_batch_size != run.global_batch_size or run.world_size < 2:
        return 0.0, f"the single baseline {single.run_id} is not comparable ({unlike(single, run)}): not used"
    b_m, big = run.per_device_batch, float(single.global_batch_size)
    fwd_m = run.forward_s if run.mode == "ddp" else (run.dp_phases.get("forward") or {}).get("device_s", 0.0)
    fwd_m /= kappa * time_share_of(run)
    per_sample = (single.forward_s - fwd_m) / (big - b_m)
    f = min(1.0, max(0.0, (fwd_m - per_sample * b_m) / fwd_m)) if fwd_m > 0 else 0.0
    return f, (f"forward of the single baseline {single.run_id} (batch {single.global_batch_size}) "
               f"and of this run (batch {b_m:g} per device{', ÷ κ' if kappa != 1 else ''}): {f:.0%} "
               "of compute does not grow with the batch")


def compute_contention(single: RunInputs | None, run: RunInputs, kappa: float, f: float) -> tuple[float, str]:
    """κ_c: the contention a DDP rank's forward and backward carry, so the model's one device computes what the
    single baseline measured: κ_c = fwd_m · (f + (1 − f)·B/b_m) / (k(n_m) · fwd_single), at least 1.

    Equal to κ wherever `fixed_fraction` found f inside [0, 1] (that f puts the line through both forwards).
    Where it had to clip f, κ (read from the optimizer step) cannot explain the rank's forward: measured on this
    2-core VM (2026-12-06), a default MLP rank's forward took 3.56 ms at batch 128 against single's 1.30 ms at
    256, while its optimizer step took 1.34x single's; with κ for both, the one-device prediction computed
    2.7x what the single run measured. Only that the rank's compute is slower beside the others is measured,
    not why (caches, memory bandwidth, the other ranks' gloo and ddpviz threads).

    Returns:
        (κ_c, source in words); (kappa, why) where no usable baseline or forward is given.
    """
    if single is None or single.mode != "single" or run.mode != "ddp" or run.world_size < 2 \
            or not same_device_size(single, run) or run.device_kind != "cpu" or not run.host_cpu_count or single.global_batch_size != run.global_batch_size:
        return kappa, "as κ (no single baseline of the same device size to set it apart)"
    if not (single.forward_s > 0 and run.forward_s > 0):
        return kappa, "as κ (no forward time in the runs)"
    scale = f + (1 - f) * single.global_batch_size / run.per_device_batch
    k_c = max(1.0, run.forward_s * scale / (time_share_of(run) * single.forward_s))
    if abs(k_c - kappa) <= 1e-9 * kappa:
        return kappa, "as κ (the forwards fit f inside 0–100%)"
    return k_c, (f"forward of DDP rank {run.run_id} {run.forward_s * 1e3:.3f} ms (batch {run.per_device_batch:g}) "
                 f"against the single baseline {single.run_id} alone {single.forward_s * 1e3:.3f} ms (batch "
                 f"{single.global_batch_size}), with f = {f:.0%}: κ_c = {k_c:.2f}, so the one-device prediction "
                 "computes what the baseline measured")
