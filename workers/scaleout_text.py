"""The predictor's inputs and assumptions in words, listed under the Scale-out charts and in
`ddpviz predict`'s output: every measured input named with the events it came from, every
assumption said as one; and the model's error on the runs outside its fit (`out_of_sample_line`)."""

from __future__ import annotations

from ddpviz.engine.predict.inputs import RunInputs
from ddpviz.engine.predict.scaleout import Scenario, in_run_factor


def _ms(s: float) -> str:
    return f"{s * 1e3:.3g} ms"


def _gbps(b: float) -> str:
    return f"{b / 1e9:.3g} GB/s"


def measured_lines(modes: dict[str, RunInputs]) -> list[str]:
    """One line per calibration run: what was measured and from which events."""
    out = []
    for mode, r in modes.items():
        where = f"{r.device_kind}, {r.host_cpu_count or '?'} cores, {r.cpu_threads_per_device or '?'} " \
                f"thread(s) per device" if r.device_kind == "cpu" else r.device_kind
        out.append(f"Measured ({mode.upper()} {r.run_id}, world size {r.world_size}, {where}): "
                   f"forward {_ms(r.forward_s)}, backward {_ms(r.backward_s)}, optimizer "
                   f"{_ms(r.optimizer_s)}, other {_ms(r.other_s)}, step {_ms(r.step_time_s)} "
                   f"(medians of {r.steps_used} steady steps{' and every rank' if mode == 'ddp' else ''}; "
                   f"from its {', '.join(dict.fromkeys(r.sources.values()))} events).")
        if mode == "ddp" and r.link_fit:
            f = r.link_fit
            out.append(f"This machine's DDP link: α = {f['alpha_s'] * 1e6:.3g} µs, β = "
                       f"{_gbps(f['beta_bytes_per_s'])} ({f['source']}); in the run the all-reduces "
                       f"took c = {in_run_factor(r, Scenario()):.3g}× the fitted model's time (c makes the "
                       "simulated exposed comm at the run's world size equal the measured one; it "
                       "carries to other world sizes).")
    return out


def assumption_lines(modes: dict[str, RunInputs], sc: Scenario, f_source: str,
                     k_source: str = "κ = 1", kc_source: str | None = None) -> list[str]:
    """The modelling choices behind this prediction, as assumptions."""
    out = [f"Global batch fixed; each device computes B/n. Compute: {f_source}."]
    if sc.compute is None:
        if any(r.device_kind == "cpu" for r in modes.values()):
            out.append("CPU: a device has max(1, cores // n) threads; intra-op threads are assumed "
                       "not to speed up these small ops; when n devices hold more threads than there "
                       "are cores, DDP's whole step and DP's forward/backward time-share (k = n·t/cores).")
            if "ddp" in modes:
                out.append(f"CPU, DDP: a rank beside other ranks runs κ× slower than a device alone "
                           f"(κ at every n ≥ 2, 1 at n = 1; DP's threads are not given it): {k_source}.")
                if sc.compute_contention is not None and sc.compute_contention != sc.contention and kc_source:
                    out.append(f"CPU, DDP: its forward and backward run κ_c× slower beside other ranks instead: "
                               f"{kc_source}.")
    else:
        gpu = sc.compute
        out.append(f"ASSUMPTION — compute on {gpu.label}: 6·N FLOPs per sample (Kaplan et al. 2020) at "
                   f"{sc.utilisation:.0%} of the {'BF16' if any(r.amp for r in modes.values()) else 'FP32'} "
                   f"peak; optimizer streams its tensors at {sc.utilisation:.0%} of "
                   f"{_gbps(gpu.hbm_bytes_per_s)} HBM; host Python as measured ({gpu.source}).")
    if sc.link is not None:
        ln = sc.link
        out.append(f"Link {ln.label}: α = {ln.alpha_s * 1e6:.3g} µs ({ln.alpha_basis}), β = "
                   f"{_gbps(ln.beta_bytes_per_s)} ({ln.beta_basis}); source: {ln.source}.")
    if sc.inter_link is not None and sc.devices_per_host:
        net = sc.inter_link
        out.append(f"Beyond {sc.devices_per_host} devices per host: DDP is one flat ring and its "
                   f"slowest link governs (α = max, β = min) with {net.label}: β = "
                   f"{_gbps(net.beta_bytes_per_s)} ({net.beta_basis}). DP stays on one host.")
    model = ("ring time 2(n−1)·α + 2(n−1)/n·bytes/β" if sc.allreduce_algo == "ring" else
             "tree time 2·⌈log2 n⌉·α + 2(n−1)/n·bytes/β (theory: NCCL's double binary tree, same "
             "bandwidth term as the ring to first order, log2 n latency)")
    out.append("DDP: all-reduces run one after another on one stream, each at max(ready, previous "
               f"end), {model}; exposed = what ends after backward.")
    out.append("DP: " + ("every broadcast and reduce is n−1 copies of the parameters through "
                         "device 0's link" if sc.dp_collectives == "hub" else
                         "broadcast and reduce go over NCCL, pipelined (device 0 sends the "
                         "parameters once)") +
               "; scatter and gather copy each device's chunk through device 0; the measured "
               "per-device host overhead (replica rebuild, Python) and thread dispatch scale with n.")
    return out


def assumptions(modes: dict[str, RunInputs], sc: Scenario, f_source: str,
                k_source: str = "κ = 1", kc_source: str | None = None) -> list[str]:
    return measured_lines(modes) + assumption_lines(modes, sc, f_source, k_source, kc_source)


def out_of_sample_line(rep: dict) -> str:
    """The model's error on the runs outside the fit, with their count, in words (the only
    error that tests it: `engine.predict.validation`)."""
    if rep.get("validation_not_checked"):
        return f"predicted vs measured on this machine: not checked ({rep['validation_not_checked']})"
    oos = rep.get("out_of_sample") or {}
    n, err = oos.get("runs", 0), oos.get("step_time_error_pct") or {}
    left = f"; {oos['in_fit']} run(s) that fed the fit are not counted" if oos.get("in_fit") else ""
    if not n:
        return ("out of sample: no run outside the fit yet, so nothing tests the prediction (run this "
                f"config at another world size){left}")
    same = oos.get("at_fit_world_sizes", 0)
    same = ("; all at the fit's world size: repeats, so this is run-to-run noise, not a test of scaling"
            if same == n else f"; {same} of them at the fit's world size (repeats)" if same else "")
    return (f"out of sample: {n} run(s), step-time error |median| {err['median_abs']:.1f}%, "
            f"|max| {err['max_abs']:.1f}%{same}{left}")
