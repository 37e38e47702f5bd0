"""The scale-out report the Scale-out page and `ddpviz predict` share (same numbers in both).

From a run id: its calibration set (the run and the runs of its group at the same world size:
DP, DDP and the single-device baseline), the predictions for the asked world sizes, and the
validation (predicted vs measured for every finished run of the same experiment on the same
hardware, always on this machine's link and measured compute), each row marked when the run fed
the fit (`engine.predict.validation.in_sample`), and the error on the others with their count
(`out_of_sample`). Imports no torch.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ddpviz.engine.predict.inputs import PredictInputError, RunInputs, measure_run
from ddpviz.engine.predict.presets import AS_MEASURED, THIS_MACHINE, compute, custom_link, link
from ddpviz.engine.predict.scaleout import Scenario, compute_contention, contention, fixed_fraction, predict
from ddpviz.engine.predict.validation import in_sample, out_of_sample, validate
from ddpviz.workers.history import read_all_events
from ddpviz.workers.scaleout_text import assumptions

# Config fields that do not change what one step costs; runs differing only in these (and in
# world_size and mode) are the same experiment at another scale.
IGNORED_FIELDS = {"world_size", "mode", "steps", "seed", "step_delay_s", "eval_every",
                  "collective_timeout_s", "nnodes", "fault", "fault_rank", "fault_step", "device",
                  "backend"}
MAX_RUNS_SCANNED = 500


def signature(config: dict[str, Any], record: dict[str, Any] | None = None) -> tuple:
    """What makes two runs the same experiment at another world size: the config without
    `IGNORED_FIELDS`, and with a run record, the hardware it ran on (`hardware`), so a GPU run is
    never checked against a CPU calibration."""
    sig = tuple(sorted((k, repr(v)) for k, v in (config or {}).items() if k not in IGNORED_FIELDS))
    return sig + (("hardware", hardware(record)),) if record is not None else sig


def hardware(record: dict[str, Any]) -> tuple:
    """(device kind, device model, backend asked for) of a run: the kind and name of its first
    device from its `run_started` (kept in the record; `engine.components.devices`: the GPU's
    model, or the host for virtual CPU devices), the backend from its config (DP and single run
    none, so the resolved one would tell a set's modes apart). A record without `run_started`
    gives the config's `device` (e.g. "auto"), which matches no finished run."""
    cfg, started = record.get("config") or {}, record.get("started") or {}
    first = (started.get("devices") or [{}])[0]
    return (first.get("kind") or cfg.get("device"), first.get("name"), cfg.get("backend"))


def calibration_set(client, run_id: str) -> dict[str, dict[str, Any]]:
    """``{mode: record}`` of the run and its group's runs at the same world size (finished).

    Raises:
        KeyError: no run `run_id`.
    """
    rec = client.get_run(run_id)
    if rec is None:
        raise KeyError(f"no run {run_id!r}")
    ws = (rec.get("config") or {}).get("world_size")
    members = {(rec.get("config") or {}).get("mode"): rec}
    if rec.get("group"):
        for r in client.list_runs(limit=MAX_RUNS_SCANNED):
            cfg = r.get("config") or {}
            if r.get("group") == rec["group"] and r["status"] == "succeeded" \
                    and (cfg.get("world_size") == ws or cfg.get("mode") == "single") \
                    and signature(cfg, r) == signature(rec.get("config"), rec):
                members.setdefault(cfg.get("mode"), r)
    return members


def measured_points(client, record: dict[str, Any]) -> list[dict[str, Any]]:
    """Finished DP/DDP runs of `record`'s experiment on its hardware (`signature`): ``{run_id,
    mode, world_size, step_time_s, samples_per_s}`` from their summaries (medians of the steady
    steps, `engine.summary.steady_steps`: the steps calibration uses too)."""
    sig, out = signature(record.get("config") or {}, record), []
    for r in client.list_runs(limit=MAX_RUNS_SCANNED):
        cfg, summary = r.get("config") or {}, r.get("summary") or {}
        if r["status"] == "succeeded" and cfg.get("mode") in ("dp", "ddp") and signature(cfg, r) == sig \
                and summary.get("samples_per_s") and (cfg.get("nnodes") or 1) == 1:
            out.append(dict(run_id=r["run_id"], mode=cfg["mode"], world_size=cfg["world_size"],
                            step_time_s=summary.get("step_time_s"), samples_per_s=summary["samples_per_s"]))
    return sorted(out, key=lambda m: (m["mode"], m["world_size"]))


def scenario_from(link_key: str = THIS_MACHINE, *, inter_link_key: str | None = None,
                  devices_per_host: int | None = None, compute_key: str = AS_MEASURED,
                  utilisation: float = 0.4, alpha_s: float | None = None,
                  beta_bytes_per_s: float | None = None, dp_collectives: str = "hub",
                  allreduce_algo: str = "ring") -> Scenario:
    """A `Scenario` from preset names (and a typed-in alpha/beta, which wins over `link_key`).

    Raises:
        ValueError: an unknown preset or a bad number, naming the field.
    """
    if alpha_s is not None or beta_bytes_per_s is not None:
        if alpha_s is None or beta_bytes_per_s is None:
            raise ValueError("alpha_s and beta_bytes_per_s go together: give both")
        intra = custom_link(alpha_s, beta_bytes_per_s)
    else:
        intra = None if link_key == THIS_MACHINE else link(link_key)
    net = link(inter_link_key) if inter_link_key else None
    return Scenario(link=intra, inter_link=net, devices_per_host=devices_per_host,
                    compute=None if compute_key == AS_MEASURED else compute(compute_key),
                    utilisation=utilisation, dp_collectives=dp_collectives, allreduce_algo=allreduce_algo)


def inputs_of(client, members: dict[str, dict[str, Any]],
              cache: dict[str, RunInputs | None] | None = None) -> dict[str, RunInputs]:
    """Measured inputs per mode (dp, ddp, single) of a calibration set. `cache` (run id ->
    inputs) spares re-reading a finished run's events; runs that cannot calibrate are skipped."""
    cache = {} if cache is None else cache
    out = {}
    for mode, rec in members.items():
        if mode not in ("dp", "ddp", "single"):
            continue
        if rec["run_id"] not in cache:
            try:
                cache[rec["run_id"]] = measure_run(read_all_events(client, rec["run_id"]))
            except PredictInputError:
                cache[rec["run_id"]] = None
        if cache[rec["run_id"]] is not None:
            out[mode] = cache[rec["run_id"]]
    return out


def report(client, run_id: str, world_sizes: list[int], scenario: Scenario, *,
           cache: dict[str, RunInputs | None] | None = None) -> dict[str, Any]:
    """Everything the page draws and `ddpviz predict --json` prints.

    Returns:
        ``{run_id, single_samples_per_s, calibration, calibration_runs, scenario, fixed_fraction, contention,
        compute_contention, predictions, validation, validation_not_checked, out_of_sample, measured, assumptions}``: predictions
        for `scenario`; validation always for this machine's link and measured compute (the only
        prediction real runs here can check), each row's `in_fit` saying whether the run fed the
        fit, empty with `validation_not_checked` saying why where that prediction cannot be made (no link
        fitted here); `out_of_sample` the error on the runs that did not, with their count.

    Raises:
        KeyError: no run `run_id`.
        ValueError: the set has no DP or DDP run to calibrate on, or a scenario setting cannot
            be used (the message names it).
    """
    members = calibration_set(client, run_id)
    measured_inputs = inputs_of(client, members, cache)
    modes = {m: i for m, i in measured_inputs.items() if m in ("dp", "ddp")}
    if not modes:
        raise ValueError(f"run_id: {run_id}'s set has no DP or DDP run with steps to calibrate on")
    single = measured_inputs.get("single")
    measured_kappa, k_source = contention(single, modes["ddp"]) if "ddp" in modes else (1.0, "no DDP run: κ = 1")
    kappa = measured_kappa
    if scenario.compute is not None:  # a GPU preset replaces the measured CPU compute κ applies to
        kappa, k_source = 1.0, f"not used: compute from the {scenario.compute.label} preset (κ = 1)"
    base = modes.get("ddp") or modes["dp"]
    f, f_source = fixed_fraction(single, base, measured_kappa if base.mode == "ddp" else 1.0)
    measured_kc, kc_source = compute_contention(single, base, measured_kappa, f)
    k_c = measured_kc if scenario.compute is None else 1.0
    if scenario.compute is not None:
        kc_source = k_source
    sc = replace(scenario, fixed_fraction=f, contention=kappa, compute_contention=k_c)
    rows = predict(modes, world_sizes, sc)
    record = next(iter(members.values()))
    points = measured_points(client, record)
    # validation is always this machine's link and measured compute, so its own κ
    here = Scenario(fixed_fraction=f, dp_collectives="hub", contention=measured_kappa, compute_contention=measured_kc)
    fit_ids = {members[m]["run_id"] for m in measured_inputs}
    baseline = measured_inputs.get("single")
    # the sources name the baseline's run when it set f or κ (engine.predict.calibrate)
    fitted = bool(baseline and baseline.run_id) and (baseline.run_id in f_source or baseline.run_id in k_source)
    try:  # a check that cannot be made (no link fit here: a preset was picked) leaves the predictions standing
        checked = validate(predict(modes, sorted({p["world_size"] for p in points} | {1}), here), points,
                           in_sample(points, fit_ids, fitted))
        not_checked = None
    except ValueError as exc:
        checked, not_checked = [], exc.args[0]
    fit_sizes = sorted({i.world_size for m, i in measured_inputs.items() if m in ("dp", "ddp")})
    single = members.get("single")
    return dict(run_id=run_id, single_samples_per_s=((single or {}).get("summary") or {}).get("samples_per_s"),
                calibration={m: _describe(i) for m, i in measured_inputs.items()},
                scenario=sc.describe(), fixed_fraction=dict(value=f, source=f_source),
                contention=dict(value=kappa, source=k_source),
                compute_contention=dict(value=k_c, source=kc_source),
                predictions=rows, validation=checked, validation_not_checked=not_checked,
                out_of_sample=out_of_sample(checked, fit_sizes),
                calibration_runs=sorted(fit_ids), measured=points,
                assumptions=assumptions(modes, sc, f_source, k_source, kc_source))


def _describe(i: RunInputs) -> dict[str, Any]:
    d = i.as_dict()
    d.pop("buckets", None)
    d["buckets"] = len(i.buckets)
    return d
