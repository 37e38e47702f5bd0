"""Scale-out: what would this run look like on 8 GPUs? A prediction calibrated on a measured run.

Pick a finished DP or DDP run (its set's other mode and single baseline are used too), a link,
a compute preset and the world sizes; the page draws predicted samples/s and scaling efficiency
for DP and DDP with the measured runs of the same config on top, the predicted bucket timeline
at one world size, and device 0's bytes in DP against a DDP rank's as n grows. Predicted vs
measured, with the error in %, is shown for every real run of the same config on the same
hardware, the runs that fed the fit marked, and the error on the others with their count. The
numbers are `workers.scaleout.report`'s, the same `ddpviz predict --json` prints.
"""

from __future__ import annotations

import streamlit as st

from ddpviz.app.charts import scaleout as cs
from ddpviz.app.connection import require_client
from ddpviz.app.frames import base as frames
from ddpviz.app.frames import scaleout as fso
from ddpviz.app.outage import guarded
from ddpviz.engine.predict.presets import AS_MEASURED, COMPUTES, DEFAULT_UTILISATION, LINKS, THIS_MACHINE
from ddpviz.engine.predict.step_models import NCCL_ALGO_NOTE
from ddpviz.workers.scaleout import calibration_set, report, scenario_from
from ddpviz.workers.scaleout_text import out_of_sample_line

CUSTOM = "custom"
DEFAULT_LINK = "pcie4"  # the page opens on a GPU box's link; this machine's is one click away
WORLD_SIZES = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
RUNS_SCANNED = 300


def pick_run(client) -> str | None:
    """`?run=ID` wins; else a selectbox of finished DP/DDP runs: first the DDP runs whose set has
    a DP run too (DP's predictions come from it), newest first, then DDP runs without one, then DP."""
    runs = [r for r in client.list_runs(limit=RUNS_SCANNED) if r["status"] == "succeeded"
            and (r.get("config") or {}).get("mode") in ("dp", "ddp")
            and (r.get("config") or {}).get("nnodes", 1) == 1]
    if not runs:
        return None
    paired = {r["run_id"] for r in runs if has_dp_partner(r, runs)}
    ids = [r["run_id"] for r in sorted(runs, key=lambda r: (r["config"]["mode"] != "ddp", r["run_id"] not in paired))]
    wanted = st.query_params.get("run")
    if wanted in ids and st.session_state.get("so_run") not in ids:
        st.session_state["so_run"] = wanted
    labels = {r["run_id"]: f"{frames.run_label(r, r['run_id'])} — {r['config'].get('model')} "
                           f"×{r['config'].get('world_size')}, batch {r['config'].get('global_batch_size')} "
                           f"({r['run_id'][:8]})"
                           + ("" if r["config"]["mode"] == "dp" or r["run_id"] in paired else " · no DP in its set")
              for r in runs}
    return st.selectbox("Measured run to calibrate on (its set's DP, DDP and single runs are used)",
                        ids, key="so_run", format_func=labels.get)


def has_dp_partner(run: dict, runs: list[dict]) -> bool:
    """A DDP run whose set (group) holds a finished DP run at its world size, as
    `workers.scaleout.calibration_set` looks for one."""
    cfg = run.get("config") or {}
    return bool(run.get("group")) and any(
        o.get("group") == run["group"] and (o.get("config") or {}).get("mode") == "dp"
        and (o.get("config") or {}).get("world_size") == cfg.get("world_size") for o in runs)


def no_dp_note(client, run_id: str) -> None:
    """Say why DP's curves are missing when the chosen run's set has no DP run."""
    members = calibration_set(client, run_id)
    if "dp" not in members:
        st.info("No DP run in this run's set (it was launched without one, e.g. an overlap sweep or a "
                "run of its own): DP's predictions are calibrated on a measured DP run, so only DDP's are "
                "drawn. Pick a run of a DP/DDP set above, or launch a DP/DDP pair of this config.",
                icon=":material/info:")


def run_backend(client, run_id: str) -> str | None:
    """The run's backend, from its record's `run_started` or else the first events of its stream."""
    started = (client.get_run(run_id) or {}).get("started") or {}
    if not started:
        events, _ = client.read_events(run_id, "0-0", 20)
        started = next((e for e in events if e.get("type") == "run_started"), {})
    return started.get("backend")


def seed_from_url(key: str, param: str, allowed: list) -> None:
    """Start widget `key` at ``?param=value`` (e.g. ``?link=nvlink-h100&compute=h100``) once."""
    value = st.query_params.get(param)
    if value in allowed and key not in st.session_state:
        st.session_state[key] = value


def link_controls() -> dict:
    """Link and network-between-hosts widgets -> `scenario_from` keyword arguments."""
    keys = [THIS_MACHINE, *[k for k, v in LINKS.items() if not v.between_hosts], CUSTOM]
    names = {THIS_MACHINE: "this machine (fitted to the run)", CUSTOM: "type your own α / β",
             **{k: v.label for k, v in LINKS.items()}}
    c1, c2, c3 = st.columns([3, 3, 2])  # the network's names are long ("InfiniBand NDR 400 Gb/s ...")
    out: dict = {}
    seed_from_url("so_link", "link", keys)
    st.session_state.setdefault("so_link", DEFAULT_LINK)
    with c1:
        choice = st.selectbox("Link between devices", keys, key="so_link", format_func=names.get)
        if choice != THIS_MACHINE:
            st.button("Use this machine's link", key="so_this_machine", icon=":material/computer:",
                      on_click=lambda: st.session_state.update(so_link=THIS_MACHINE),
                      help=fso.this_machine_means(st.session_state.get("so_backend")))
    if choice == CUSTOM:
        a, b, _ = st.columns([3, 3, 2])
        with a:
            out["alpha_s"] = st.number_input("α (µs per ring step)", value=1.0, min_value=0.0,
                                             key="so_alpha_us") * 1e-6
        with b:
            out["beta_bytes_per_s"] = st.number_input("β (GB/s per direction)", value=25.0,
                                                      min_value=0.001, key="so_beta_gbps") * 1e9
    else:
        out["link_key"] = choice
    if choice != THIS_MACHINE:
        with c3:
            per_host = st.number_input("devices per host", value=8, min_value=1, step=1, key="so_per_host")
        nets = [k for k, v in LINKS.items() if v.between_hosts]
        with c2:
            net = st.selectbox("Network between hosts", nets, index=nets.index("ib400"),
                               key="so_net", format_func=lambda k: LINKS[k].label.removesuffix(" between hosts"))
        out.update(devices_per_host=int(per_host), inter_link_key=net)
    return out


def compute_controls() -> dict:
    c1, c2, c3 = st.columns([3, 2, 4])
    seed_from_url("so_compute", "compute", [AS_MEASURED, *COMPUTES])
    with c1:
        key = st.selectbox("Compute", [AS_MEASURED, *COMPUTES], key="so_compute",
                           format_func=lambda k: "as measured" if k == AS_MEASURED
                           else f"{COMPUTES[k].label} (assumed utilisation)")
    out = dict(compute_key=key)
    if key != AS_MEASURED:
        with c2:
            out["utilisation"] = st.slider("utilisation of peak", 0.05, 1.0, DEFAULT_UTILISATION,
                                           0.05, key="so_util")
    with c3:
        out["dp_collectives"] = st.radio(
            "DP's broadcast and reduce", ["hub", "nccl"], horizontal=True, key="so_dpc",
            format_func=lambda k: "n−1 copies through device 0" if k == "hub" else "NCCL, pipelined",
            help="torch's DataParallel uses NCCL broadcast/reduce on GPUs when NCCL is there "
                 "(torch/csrc/cuda/comm.cpp); the CPU emulation copies through device 0.")
    out["allreduce_algo"] = st.radio(
        "DDP's all-reduce model", ["ring", "tree"], horizontal=True, key="so_algo",
        format_func=lambda k: "ring: latency 2(n−1)·α" if k == "ring" else "tree: latency 2·⌈log2 n⌉·α",
        help="Theory: both move 2(n−1)/n·bytes per rank to first order; they differ in latency. "
             + NCCL_ALGO_NOTE)
    return out


def scenario_label(rep: dict) -> str:
    sc = rep["scenario"]
    link = "this machine's link" if sc["link"] == THIS_MACHINE else \
        LINKS[sc["link"]].label.split(" (")[0] if sc["link"] in LINKS else "your α/β"
    comp = "measured compute" if sc["compute"] == AS_MEASURED else \
        f"ASSUMED {COMPUTES[sc['compute']].label} at {sc['utilisation']:.0%} of peak"
    algo = f", {sc['allreduce_algo']} all-reduce (theory)" if sc.get("allreduce_algo", "ring") != "ring" else ""
    return f"{link}, {comp}{algo}"


@guarded
def body(client, run_id: str, kwargs: dict, world_sizes: list[int]) -> None:
    cache = st.session_state.setdefault("so_inputs", {})
    try:
        rep = report(client, run_id, world_sizes, scenario_from(**kwargs), cache=cache)
    except (KeyError, ValueError) as exc:
        st.error(f"Cannot predict: {exc.args[0]}", icon=":material/warning:")
        return
    what = scenario_label(rep)
    pred, measured = fso.prediction_frame(rep), fso.measured_frame(rep, rep.get("single_samples_per_s"))
    left, right = st.columns(2)
    with left:
        st.altair_chart(cs.predicted_throughput_chart(pred, measured, scenario=what), key="so_tput")
    same_here = rep["scenario"]["link"] == THIS_MACHINE and rep["scenario"]["compute"] == AS_MEASURED
    single = rep.get("single_samples_per_s") if same_here else None
    with right:  # one baseline for both series: the single run's measured rate where the points are drawn
        st.altair_chart(cs.efficiency_chart(fso.on_measured_single(pred, single),
                                            measured if same_here else measured.iloc[0:0], scenario=what,
                                            one_device="the single run's measured samples/s" if single else
                                            "the model's one device's"), key="so_eff")
    slowdown = fso.host_slowdown_text(rep, as_measured=rep["scenario"]["compute"] == AS_MEASURED,
                                      fitted_link=rep["scenario"]["link"] == THIS_MACHINE)  # ~0% at n = 8 on 2 cores
    if slowdown:
        st.caption(slowdown)
    if not same_here:
        st.caption("Measured runs ran on this machine, not on the chosen link or compute: they are "
                   "drawn on the throughput chart for scale only; the table compares them with this "
                   "machine's prediction.")
    validation_table(rep)
    ddp_sizes = sorted({p["world_size"] for p in rep["predictions"] if p["mode"] == "ddp"})
    n = st.select_slider("world size of the predicted bucket timeline", ddp_sizes,
                         value=8 if 8 in ddp_sizes else ddp_sizes[-1], key="so_tl_n") if ddp_sizes else None
    left, right = st.columns(2)
    with left:
        if n is not None:
            row = fso.ddp_row(rep, n)
            st.altair_chart(cs.predicted_timeline(*fso.timeline_frames(row), world_size=n,
                                                  link=f"{row['link']['what']}"), key="so_tl")
        else:
            st.info("No DDP run in this set: the bucket timeline needs one.", icon=":material/info:")
    with right:
        st.altair_chart(cs.bytes_chart(fso.bytes_frame(rep)), key="so_bytes")
        st.caption(fso.crossover_text(rep))
    st.markdown("**Inputs and assumptions of this prediction**")
    st.markdown("\n".join(f"- {line}" for line in rep["assumptions"]))


def validation_table(rep: dict) -> None:
    st.markdown("**Predicted vs measured on this machine** (this machine's link, measured compute; "
                "every finished run of the same config on the same hardware)")
    if rep.get("validation_not_checked"):
        st.info(out_of_sample_line(rep), icon=":material/info:")
        return
    table = fso.validation_frame(rep)
    st.markdown(f"**{out_of_sample_line(rep)}**. A run that fed the fit (marked \"{fso.IN_FIT}\") "
                "comes back by construction: its error tests nothing.")
    if table.empty:
        st.caption("No finished DP or DDP run of this config yet: launch a world-size sweep on the "
                   "Sweeps page to check the prediction.")
        return
    st.dataframe(table.drop(columns=["why"]), hide_index=True, key="so_validation", column_config={
        "step error %": st.column_config.NumberColumn(format="%+.1f%%"),
        "measured step (ms)": st.column_config.NumberColumn(format="%.3f"),
        "predicted step (ms)": st.column_config.NumberColumn(format="%.3f")})
    why = table[table["why"] != ""]
    if not why.empty:
        st.caption("In the fit: " + "; ".join(f"{r} ({w})" for r, w in zip(why["run"], why["why"])))


st.title("Scale-out")
st.caption("What would this run do on 8 GPUs, over PCIe or NVLink, or on 2 hosts? A prediction "
           "calibrated on the run you measured; below it, its error on the real runs that fed nothing "
           "into the fit.")
client = require_client()
run_id = pick_run(client)
if run_id is None:
    st.info("No finished DP or DDP run yet: launch a DP/DDP pair on the Launch page.",
            icon=":material/info:")
    st.page_link("views/launch.py", label="Launch a run", icon=":material/rocket_launch:")
    st.stop()
no_dp_note(client, run_id)
st.session_state["so_backend"] = run_backend(client, run_id)
st.caption(fso.this_machine_means(st.session_state["so_backend"]))
kwargs = {**link_controls(), **compute_controls()}
top = st.select_slider("largest world size", WORLD_SIZES, value=16, key="so_max_n")
body(client, run_id, kwargs, [n for n in WORLD_SIZES if n <= top])
