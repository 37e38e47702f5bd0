"""Scale-out predictor: DP and DDP at world size n, calibrated on one measured run.

Pure Python (no torch). Inputs come from `engine.predict.inputs.measure_run`, κ and f from
`engine.predict.calibrate`, links and GPUs from
`engine.predict.presets`, the two step models from `engine.predict.step_models`. docs/predict.md
explains every formula with its source and lists the presets; this docstring is the summary.

Compute (one device, batch b = B/n of the global batch B):
  as measured, c(b) = c_m · (f + (1 − f) · b/b_m) · k(n)/k(n_m), where c_m is the measured
  forward (and backward) of the run's per-device batch b_m and f the share of it that does not
  grow with the batch (kernel launches, Python per layer). f comes from the forward of the
  single-device baseline of the same set (batch B on a device of the same size) and of the run
  (b_m, ÷ κ for a DDP rank: see below): two batch sizes, one line; without a baseline f = 0 (all compute proportional to the
  batch, which overstates the gain of a smaller batch).
  On CPU a device is `t(n) = max(1, cores // n)` intra-op threads (engine.components.training
  .cpu_threads_per_rank); intra-op threads are assumed not to speed these small ops up, and when
  the n devices hold more threads than the host has cores they time-share:
  k(n) = max(1, n·t(n)/cores). DDP's ranks all do the same thing at once, so k scales the whole
  step (optimizer, the host's Python, and gloo's all-reduce, CPU work too); in DP only forward
  and backward run on every device thread at once (loss, optimizer and copies run on device 0's
  thread while the others wait). On GPUs k = 1.
  A DDP rank beside other ranks on a CPU host is also slower than a device alone (memory
  bandwidth, caches, the others' gloo threads): u(n) = 1 at n = 1, κ at n ≥ 2, with κ measured
  as the rank's optimizer step over the single baseline's (`contention`: the same work in both),
  so DDP's compute, optimizer and host time carry u(n)/u(n_m) too. Without a baseline κ = 1.
  Where the forwards cannot fit f inside [0, 1] with κ (the rank's forward at B/n_m, ÷ κ, slower than the
  baseline's at B), its forward and backward carry their own κ_c instead (`compute_contention`), the one
  that makes the one-device forward the baseline's measured one; κ_c = κ wherever f fits.
  With a GPU preset, forward + backward = 6·N·tokens·b / (peak · utilisation) (Kaplan et al. 2020,
  "Scaling laws", §2.1: 2N forward, 4N backward FLOPs per token), split 1:2; the optimizer
  streams (3 for SGD, 7 for AdamW)·P bytes at HBM bandwidth · utilisation; the host's Python stays
  as measured. This is an assumption, and every chart that uses it says so.
Optimizer time is per parameter: it does not change with n.
DDP and DP: `engine.predict.step_models`. On this machine's link, DDP's all-reduces take the fitted
ring model's time × c, the one factor that makes the simulated exposed comm at the run's own
world size equal the measured one (`in_run_factor`). DDP across hosts (n > devices_per_host): one flat ring over
every rank whose slowest link governs, α = max(α_host, α_net), β = min(β_host, β_net) (each ring
crosses every host boundary once per direction; NCCL's hierarchical and tree algorithms do
better on many hosts, so this errs slow). DP runs in one process: it has no prediction beyond
one host.
DP's per-device host overhead (replicate's module rebuilds, the Python around each copy) is
measured: device 0's span of each copy phase / (n_m − 1) minus the copy of its bytes at this
machine's copy rate (the fastest per-byte rate the run's parameter-sized copies reached, so the
overhead is a lower bound); the thread phases' dispatch and GIL wait is the phase's wall time
minus the slowest device's own span, growing with the number of threads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ddpviz.engine.analysis import ring_factor
from ddpviz.engine.predict.calibrate import compute_contention, contention, fixed_fraction, time_share_of
from ddpviz.engine.predict.inputs import RunInputs
from ddpviz.engine.predict.presets import AS_MEASURED, DEFAULT_UTILISATION, THIS_MACHINE, ComputePreset, LinkPreset
from ddpviz.engine.predict.step_models import (
    bucket_pipeline,
    cpu_threads,
    ddp_step,
    dp_step,
    hub_copies_s,
    pipelined_copies_s,
    ALLREDUCE_MODELS,
    allreduce_s,
    ring_allreduce_s,
    time_share,
)
from ddpviz.engine.predict.validation import in_sample, out_of_sample, validate  # re-exported

__all__ = ["Scenario", "predict", "predict_ddp", "predict_dp", "fixed_fraction", "contention", "compute_contention",
           "validate",
           "in_sample", "out_of_sample",
           "cpu_threads", "time_share",
           "bucket_pipeline"]
OPTIMIZER_STREAMS = {"sgd": 3, "adamw": 7}  # tensors of P bytes read or written per step


@dataclass(frozen=True)
class Scenario:
    """What to predict for.

    Attributes:
        link: the link inside a host; None means this machine's own (fitted) link.
        inter_link: the network between hosts (used when n > devices_per_host).
        devices_per_host: GPUs per host; None: every n fits on one host.
        compute: a GPU preset; None keeps the measured compute ("as measured").
        utilisation: share of the GPU's peak a step reaches (GPU presets only).
        fixed_fraction: share of measured compute that does not grow with the batch.
        dp_collectives: "hub" (n−1 copies through device 0, as the emulation and torch without
            NCCL do) or "nccl" (torch's broadcast_coalesced / reduce_add over NCCL, pipelined).
        contention: κ ≥ 1, how much slower a DDP rank's work runs beside the other ranks of its
            CPU host than the same work alone (`contention`; 1: none known).
        compute_contention: κ_c ≥ 1 for a DDP rank's forward and backward (`compute_contention`); None: κ.
        allreduce_algo: DDP's all-reduce model, "ring" or "tree" (`step_models.ALLREDUCE_MODELS`:
            the same bandwidth term, latency 2(n−1)·α or 2·⌈log2 n⌉·α); theory either way.
    """

    link: LinkPreset | None = None
    inter_link: LinkPreset | None = None
    devices_per_host: int | None = None
    compute: ComputePreset | None = None
    utilisation: float = DEFAULT_UTILISATION
    fixed_fraction: float = 0.0
    dp_collectives: str = "hub"
    contention: float = 1.0
    allreduce_algo: str = "ring"
    compute_contention: float | None = None

    def describe(self) -> dict[str, Any]:
        return dict(link=self.link.key if self.link else THIS_MACHINE,
                    inter_link=self.inter_link.key if self.inter_link else None,
                    devices_per_host=self.devices_per_host,
                    compute=self.compute.key if self.compute else AS_MEASURED,
                    utilisation=self.utilisation if self.compute else None,
                    fixed_fraction=self.fixed_fraction, dp_collectives=self.dp_collectives,
                    contention=self.contention, allreduce_algo=self.allreduce_algo,
                    compute_contention=self.compute_contention)


def check_scenario(sc: Scenario) -> None:
    """Raises ValueError naming the field when a setting cannot be used."""
    if sc.devices_per_host is not None and sc.devices_per_host < 1:
        raise ValueError(f"devices_per_host must be >= 1 (got {sc.devices_per_host})")
    if not 0 < sc.utilisation <= 1:
        raise ValueError(f"utilisation must be in (0, 1] (got {sc.utilisation})")
    if not 0 <= sc.fixed_fraction <= 1:
        raise ValueError(f"fixed_fraction must be in [0, 1] (got {sc.fixed_fraction})")
    if not (sc.contention >= 1 and math.isfinite(sc.contention)):
        raise ValueError(f"contention must be a finite number >= 1 (got {sc.contention})")
    if sc.compute_contention is not None and not (sc.compute_contention >= 1 and math.isfinite(sc.compute_contention)):
        raise ValueError(f"compute_contention must be a finite number >= 1 (got {sc.compute_contention})")
    if sc.dp_collectives not in ("hub", "nccl"):
        raise ValueError(f"dp_collectives must be 'hub' or 'nccl' (got {sc.dp_collectives!r})")
    if sc.allreduce_algo not in ALLREDUCE_MODELS:
        raise ValueError(f"allreduce_algo must be one of {sorted(ALLREDUCE_MODELS)} (got {sc.allreduce_algo!r})")


# -- compute --------------------------------------------------------------------------------

def beside(n: int, sc: Scenario, compute: bool = False) -> float:
    """u(n): a DDP rank's slow-down from sharing its CPU host with other ranks; 1 alone (n = 1),
    κ (`Scenario.contention`) beside others (n ≥ 2: every core busy, as at calibration); for its forward and
    backward (`compute`) κ_c (`Scenario.compute_contention`, κ when None)."""
    if n == 1:
        return 1.0
    return sc.compute_contention if compute and sc.compute_contention is not None else sc.contention


def host_factor(r: RunInputs, n: int, sc: Scenario, compute: bool = False) -> float:
    """k(n)/k(n_m) for a CPU run predicted as measured, else 1; for DDP also u(n)/u(n_m) (`beside`; with
    `compute`, the forward's and backward's)."""
    if r.device_kind != "cpu" or sc.compute is not None or not r.host_cpu_count:
        return 1.0
    k = time_share(n, r.host_cpu_count) / time_share_of(r)
    return k * (beside(n, sc, compute) / beside(r.world_size, sc, compute) if r.mode == "ddp" else 1.0)


def batch_scale(r: RunInputs, n: int, f: float) -> float:
    """c(b)/c(b_m) from the batch alone: f + (1 − f)·b/b_m with b = B/n."""
    return f + (1 - f) * (r.global_batch_size / n) / r.per_device_batch


def preset_compute_s(r: RunInputs, n: int, sc: Scenario) -> tuple[float, float, float]:
    """(forward_s, backward_s, optimizer_s) of one device on the GPU preset."""
    gpu = sc.compute
    peak = (gpu.bf16_flops if r.amp else gpu.fp32_flops) * sc.utilisation
    fb = 6 * r.param_count * r.tokens_per_sample * (r.global_batch_size / n) / peak
    opt = OPTIMIZER_STREAMS.get(r.optimizer, 3) * r.grad_bytes / (gpu.hbm_bytes_per_s * sc.utilisation)
    return fb / 3, 2 * fb / 3, opt


# -- links ----------------------------------------------------------------------------------

def hosts_for(n: int, sc: Scenario) -> int:
    return 1 if sc.devices_per_host is None else math.ceil(n / sc.devices_per_host)


def ring_link(r: RunInputs, n: int, sc: Scenario) -> tuple[float, float, str]:
    """(α, β, what) of DDP's ring at world size n (slowest link governs across hosts).

    Raises:
        ValueError: this machine's link is asked for but the run has no fit (world_size 1).
    """
    if sc.link is None:
        if not r.link_fit:
            raise ValueError("link: this machine's link needs a DDP run with world_size >= 2 "
                             "(a probe or buckets to fit); pick a link preset")
        alpha, beta, what = r.link_fit["alpha_s"], r.link_fit["beta_bytes_per_s"], "this machine"
    else:
        alpha, beta, what = sc.link.alpha_s, sc.link.beta_bytes_per_s, sc.link.label
    if hosts_for(n, sc) > 1:
        net = sc.inter_link
        if net is None:
            raise ValueError(f"inter_link: world size {n} spans {hosts_for(n, sc)} hosts of "
                             f"{sc.devices_per_host}; name the network between them")
        alpha, beta = max(alpha, net.alpha_s), min(beta, net.beta_bytes_per_s)
        what = f"flat {sc.allreduce_algo} over {what} and {net.label}"
    return alpha, beta, what


def dp_copy_rate(r: RunInputs) -> float | None:
    """This machine's DP copy rate (bytes/s): the fastest per-byte rate among the run's
    parameter-sized copies (broadcast, reduce) on devices other than 0; None without copies."""
    rates = [p["bytes_per_copy"] / p["copy_s"] for name in ("broadcast", "reduce")
             if (p := r.dp_phases.get(name)) and p.get("copy_s") and p.get("bytes_per_copy")]
    return max(rates) if rates else None


def dp_link(r: RunInputs, sc: Scenario) -> tuple[float, float]:
    """(α, β) of device 0's link for DP's copies."""
    if sc.link is not None:
        return sc.link.alpha_s, sc.link.beta_bytes_per_s
    rate = dp_copy_rate(r)
    if rate is None:
        raise ValueError("link: this machine's DP copy rate needs a DP run with world_size >= 2; "
                         "pick a link preset")
    return 0.0, rate


# -- the two modes --------------------------------------------------------------------------

def _compute(r: RunInputs, n: int, sc: Scenario, fwd_m: float, bwd_m: float) -> tuple[float, float, float]:
    """(forward_s, backward_s, optimizer_s) of one device at world size n."""
    if sc.compute is not None:
        return preset_compute_s(r, n, sc)
    s = batch_scale(r, n, sc.fixed_fraction) * host_factor(r, n, sc, compute=True)
    return fwd_m * s, bwd_m * s, r.optimizer_s * host_factor(r, n, sc)


def in_run_factor(r: RunInputs, sc: Scenario) -> float:
    """c: how much slower the run's all-reduces were than the fitted model says, so that the
    simulated step at n_m shows the measured exposed comm (found by bisection; exposed grows
    with c). With nothing exposed it cannot be read from exposed comm, so c = the link's
    measured busy time per step / the model's time for the same buckets (1 without either)."""
    alpha, beta = r.link_fit["alpha_s"], r.link_fit["beta_bytes_per_s"]
    model = sum(ring_allreduce_s(b["nbytes"], r.world_size, alpha, beta) for b in r.buckets)
    c = r.comm_busy_s / model if r.comm_busy_s and model > 0 else 1.0
    if r.comm_exposed_s <= 0 or not r.buckets:
        return c

    def exposed(c_try: float) -> float:
        fwd, bwd, opt = _compute(r, r.world_size, sc, r.forward_s, r.backward_s)
        return ddp_step(forward_s=fwd, backward_s=bwd, optimizer_s=opt, other_s=0.0,
                        buckets=[(b["bucket_index"], b["nbytes"]) for b in r.buckets],
                        ready_frac=[b["ready_frac"] for b in r.buckets], n=r.world_size, overlap=r.overlap,
                        comm=lambda nb: ring_allreduce_s(nb, r.world_size, alpha, beta) * c_try)["comm_exposed_s"]
    lo, hi = 0.0, max(1.0, 2 * c)
    while exposed(hi) < r.comm_exposed_s and hi < 1e6:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if exposed(mid) < r.comm_exposed_s else (lo, mid)
    return (lo + hi) / 2


def _bucket_comm(r: RunInputs, n: int, sc: Scenario, alpha: float, beta: float):
    """A bucket's all-reduce time at n. On a preset: the ring (or tree, `Scenario.allreduce_algo`)
    model. On this machine: that model with the fitted α, β, × the in-run factor c
    (`in_run_factor`, found with the ring the run's gloo used: the run's own exposed comm is
    reproduced at n_m) × the host factor (gloo's all-reduce is CPU work)."""
    algo = sc.allreduce_algo
    if sc.link is not None or n == 1:
        return lambda nb: allreduce_s(algo, nb, n, alpha, beta)
    scale = in_run_factor(r, Scenario()) * host_factor(r, n, sc)
    return lambda nb: allreduce_s(algo, nb, n, alpha, beta) * scale


def predict_ddp(r: RunInputs, n: int, sc: Scenario) -> dict[str, Any]:
    """One DDP step at world size n (see module doc).

    Returns:
        `engine.predict.step_models.ddp_step`'s dict plus samples_per_s, world_size, nnodes, link
        (α, β, what) and bytes_per_rank (sent = received per step, ring all-reduce).
    """
    fwd, bwd, opt = _compute(r, n, sc, r.forward_s, r.backward_s)
    hf = host_factor(r, n, sc)
    buckets = r.buckets or [dict(bucket_index=0, nbytes=r.grad_bytes, ready_frac=1.0)]
    alpha, beta, what = ring_link(r, n, sc) if n > 1 else (0.0, 1.0, "none (one rank)")
    out = ddp_step(forward_s=fwd, backward_s=bwd, optimizer_s=opt,
                   other_s=r.other_s * (hf if sc.compute is None else 1.0),
                   buckets=[(b["bucket_index"], b["nbytes"]) for b in buckets],
                   ready_frac=[b["ready_frac"] for b in buckets], n=n, overlap=r.overlap,
                   comm=_bucket_comm(r, n, sc, alpha, beta))
    total = sum(b["nbytes"] for b in buckets)
    out.update(mode="ddp", world_size=n, nnodes=hosts_for(n, sc),
               samples_per_s=r.global_batch_size / out["step_time_s"],
               link=dict(alpha_s=alpha, beta_bytes_per_s=beta, what=what),
               bytes_per_rank=ring_factor(n) * total)
    return out


def _dp_overhead_s(r: RunInputs, phase: str, rate: float) -> float:
    """Per-device host overhead of a copy phase: hub span / (n_m − 1) − bytes / copy rate."""
    p = r.dp_phases.get(phase) or {}
    if r.world_size < 2 or not p:
        return 0.0
    return max(0.0, p.get("hub_s", 0.0) / (r.world_size - 1) - p.get("bytes_per_copy", 0.0) / rate)


def _dp_threads_s(r: RunInputs, phase: str, n: int, device_s: float) -> float:
    """A thread phase at n devices: the slowest replica's `device_s` + the measured dispatch and
    GIL wait per extra thread."""
    p = r.dp_phases.get(phase) or {}
    extra = max(0.0, p.get("wall_s", 0.0) - p.get("device_s", 0.0))
    per_thread = extra / (r.world_size - 1) if r.world_size > 1 else 0.0
    return device_s + per_thread * (n - 1)


def dp_copy_bytes(r: RunInputs, phase: str, n: int) -> float:
    """Bytes of one copy of `phase` at n devices: parameters for broadcast/reduce; for scatter
    and gather a device's share of the batch, B/n samples (chunk)."""
    p = r.dp_phases.get(phase) or {}
    nb = p.get("bytes_per_copy", r.grad_bytes if phase in ("broadcast", "reduce") else 0.0)
    return nb * r.world_size / n if phase in ("scatter", "gather") else nb


def predict_dp(r: RunInputs, n: int, sc: Scenario) -> dict[str, Any] | None:
    """One DP step at n devices, or None when n devices span more than one host.

    Returns:
        `engine.predict.step_models.dp_step`'s dict plus samples_per_s, nnodes, link (α, β) and
        device0_bytes (sent + received by device 0 per step).
    """
    if hosts_for(n, sc) > 1:
        return None
    alpha, beta = dp_link(r, sc) if n > 1 else (0.0, math.inf)
    rate = dp_copy_rate(r) or math.inf
    phases: dict[str, float] = {}
    dev0 = 0.0
    for name in ("broadcast", "scatter", "gather", "reduce"):
        nb, o = dp_copy_bytes(r, name, n), _dp_overhead_s(r, name, rate)
        chain = sc.dp_collectives == "nccl" and name in ("broadcast", "reduce")
        fn = pipelined_copies_s if chain else hub_copies_s
        phases[name] = fn(n, nb, alpha, beta, o)
        dev0 += nb * (min(1, n - 1) if chain else n - 1)
    fwd_m = (r.dp_phases.get("forward") or {}).get("device_s", r.forward_s)
    bwd_m = (r.dp_phases.get("backward") or {}).get("device_s", r.backward_s)
    fwd, bwd, _ = _compute(r, n, sc, fwd_m, bwd_m)
    phases["forward"] = _dp_threads_s(r, "forward", n, fwd)
    phases["backward"] = _dp_threads_s(r, "backward", n, bwd)
    # device 0 works alone in these (the other threads wait), so they do not time-share
    phases["loss"] = (r.dp_phases.get("loss") or {}).get("hub_s", 0.0)
    phases["optimizer"] = preset_compute_s(r, n, sc)[2] if sc.compute else r.optimizer_s
    phases["other"] = (r.dp_phases.get("other") or {}).get("wall_s", r.other_s)
    out = dp_step(n=n, phases=phases)
    out.update(mode="dp", nnodes=1, samples_per_s=r.global_batch_size / out["step_time_s"],
               link=dict(alpha_s=alpha, beta_bytes_per_s=beta,
                         what=sc.link.label if sc.link else "this machine (DP copies)"),
               device0_bytes=dev0)
    return out


# -- the grid, validation ------------------------------------------------------------------

def predict(inputs: dict[str, RunInputs], world_sizes: list[int], sc: Scenario) -> list[dict[str, Any]]:
    """Predictions for every mode in `inputs` ("dp", "ddp") and world size.

    Returns:
        Rows ``{mode, world_size, nnodes, step_time_s, samples_per_s, efficiency, ...}``;
        efficiency = samples/s(n) / (n · samples/s of one device), one device being the DDP
        prediction at n = 1 (no communication) when DDP inputs exist, else DP's. DP at n = 1 is
        that one device's step (`one_device_dp`), so both modes start at 100%. DP rows beyond
        one host are left out.

    Raises:
        ValueError: a world size < 1, or a scenario setting that cannot be used (named).
    """
    check_scenario(sc)
    if any(n < 1 for n in world_sizes):
        raise ValueError(f"world_sizes must all be >= 1 (got {world_sizes})")
    fns = {"ddp": predict_ddp, "dp": predict_dp}
    base_mode = "ddp" if "ddp" in inputs else "dp"
    one = fns[base_mode](inputs[base_mode], 1, sc)
    rows = []
    for mode in ("dp", "ddp"):
        if mode not in inputs:
            continue
        for n in sorted(set(world_sizes)):
            if mode == "dp" and n == 1 and base_mode == "ddp":
                p = one_device_dp(one)
            else:
                p = fns[mode](inputs[mode], n, sc)
            if p is None:
                continue
            p["efficiency"] = p["samples_per_s"] / (n * one["samples_per_s"])
            rows.append(p)
    return rows


ONE_DEVICE_DP = ("DataParallel on one device checks its parameters' device, scatters the inputs to it and runs "
                 "its module directly (torch.nn.parallel.DataParallel.forward: `if len(self.device_ids) == 1: "
                 "return self.module(...)`): no replicas, threads, gather or reduce, so its step is one device's, "
                 "the same as DDP's at n = 1")


def one_device_dp(one: dict[str, Any]) -> dict[str, Any]:
    """DP's row at n = 1 from `one`, the one-device step (`predict_ddp` at n = 1): its step time and
    samples/s and its phases, nothing copied (`ONE_DEVICE_DP` says why)."""
    return dict(mode="dp", world_size=1, nnodes=1, step_time_s=one["step_time_s"], samples_per_s=one["samples_per_s"],
                phases={k: one[f"{k}_s"] for k in ("forward", "backward", "optimizer", "other")},
                comm_s=0.0, device0_bytes=0.0,
                link=dict(alpha_s=0.0, beta_bytes_per_s=math.inf, what="none (one device)"), note=ONE_DEVICE_DP)
