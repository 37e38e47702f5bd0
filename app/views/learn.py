"""Learn: the communication patterns, drawn from the selected runs' bytes per link (DP's
measured on its copies, DDP's derived from the bytes it all-reduced, FSDP's from its collectives).

DataParallel is a star around device 0; DistributedDataParallel's all-reduce is a ring (each
drawing uses each rank's latest `comm_volume` event), drawn again beside NCCL's tree
at a chosen world size (theory, scaled from the run's gradient bytes); FSDP shards every unit, gathers
it and scatters its gradients (drawn from the run's `fsdp_collective` events).
"""

from __future__ import annotations

import streamlit as st

from ddpviz.app import explain, panels, runsets
from ddpviz.app.charts.dp import thread_states_chart
from ddpviz.app.charts.topology import topology_chart
from ddpviz.app.connection import require_client
from ddpviz.app.frames import buckets as frames_buckets
from ddpviz.app.frames import topology as ftop
from ddpviz.app.frames.dp import thread_states_frame
from ddpviz.app.frames.theory import fit_miss
from ddpviz.app.widgets import plain
from ddpviz.engine.analysis import fit_covers, format_bytes

STAR_TEXT = """
**DataParallel: a star.** One process drives every device from threads. Each step device 0
*broadcasts* the weights to every replica and *scatters* the batch; each device runs forward;
device 0 *gathers* the outputs, computes the loss, and after backward *reduces* every replica's
gradients onto itself and runs the optimizer alone. Every byte passes through device 0, so its
link carries (n−1) times what any other device's does, and the others wait while it works.
Link widths: the bytes of the tensors this run really copied (measured).
"""
RING_TEXT = """
**DistributedDataParallel: a ring.** One process per rank, each with its own copy of the model
and its own shard of the data. Gradients are grouped in buckets; when a bucket is ready its
*all-reduce* starts while backward continues. A ring all-reduce passes chunks around the ring in
2(n−1) hops, so every rank sends and receives 2(n−1)/n·P bytes — the same on every link, and
below 2·P however many ranks join. Every rank then steps its own optimizer: no broadcast needed. Link widths: the bucket bytes
this run handed to all-reduce (measured) times the ring factor 2(n−1)/n (derived).
"""


SHARD_TEXT = """
**Fully sharded data parallel (FSDP2): shards, gather, scatter.** One process per rank, as in DDP,
but no rank holds the whole model: each keeps 1/n of every parameter, of its gradient and of its
optimizer state. The model is cut into units (here one per block, plus the root). Before a unit's
forward every rank *all-gathers* the unit: it receives the n−1 shards it lacks, computes, and frees
them again; backward gathers the unit once more, and afterwards a *reduce-scatter* sums every rank's
gradient of the unit and hands each rank the average of its own shard only. With ring
collectives each rank moves 3(n−1)/n·P per step (DDP: 2(n−1)/n·P; gloo's reduce-scatter is an
all-reduce, so more on CPU), and holds about 1/n of what a DDP rank holds, plus one gathered unit
at a time.
"""


def shards_section(fsdp, labels) -> None:
    """The third picture: one FSDP run's unit, sharded, gathered and scattered."""
    from ddpviz.app.charts import fsdp as charts_fsdp
    from ddpviz.app.frames import fsdp as frames_fsdp

    st.markdown(SHARD_TEXT)
    for rid, w in fsdp[:1]:
        shards = frames_fsdp.shard_frame(w.of_type("fsdp_collective"))
        if shards.empty:
            st.info(f"{plain(labels[rid])}: waiting for the first step's collectives…",
                    icon=":material/hourglass_empty:")
            continue
        st.altair_chart(charts_fsdp.shard_chart(shards), key="learn_shards")
        st.caption(f"{plain(labels[rid])}: the unit with the largest all-gather; sizes are the shard bytes "
                   "its all-gather and reduce-scatter carried (measured).")


THEORY_SIZES = [2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
TREE_TEXT = """
**Beside the ring: the tree.** NCCL also all-reduces over binary trees: the data is reduced up
a tree to its root and broadcast back down, in chunks that follow each other. A chunk crosses
⌈log2 n⌉ links each way instead of the ring's n−1 hops, so the latency term grows with log2 n;
NCCL runs two trees at once (each rank a leaf in one, inside the other), each carrying half the
data, so every rank still moves about 2·P, the ring's 2(n−1)/n·P to first order. Below, the three
patterns at a world size you choose, with the bytes on each link worked out from this run's
gradient bytes P by each pattern's formula: **theory**, not a measurement.
"""


def theory_section(windows, labels) -> None:
    """Star, ring and tree at a chosen n, scaled from one run's gradient bytes (theory)."""
    from ddpviz.app.charts.topology import allreduce_time_chart
    from ddpviz.engine.predict.step_models import ALLREDUCE_MODELS, NCCL_ALGO_NOTE

    run = next(((rid, w) for rid, w in windows.items() if (w.started or {}).get("grad_bytes")), None)
    if run is None:
        return
    rid, w = run
    p_bytes, ws = float(w.started["grad_bytes"]), int(w.started.get("world_size") or 2)
    st.markdown(TREE_TEXT)
    default = 8 if ws == 2 or ws not in THEORY_SIZES else ws
    n = st.select_slider("world size n of the drawings (theory)", THEORY_SIZES, value=default, key="learn_theory_n")
    drawn = [("star (DP)", *ftop.theory_star(n, p_bytes)), ("ring (DDP)", *ftop.theory_ring(n, p_bytes)),
             ("tree (one of NCCL's two)", *ftop.theory_tree(n, p_bytes))]
    top = max(float(e["mib"].max()) for _, _, e in drawn if not e.empty)
    steps = ftop.latency_steps(n)
    subs = {"star (DP)": f"2·P per link per step; device 0 makes {steps['star']} copies in turn",
            "ring (DDP)": f"2(n−1)/n·P per link; {steps['ring']} steps in sequence (latency ∝ n−1)",
            "tree (one of NCCL's two)": f"P per link (half up, half down); {steps['tree']} steps (∝ log2 n)"}
    for col, (kind, nodes, edges) in zip(st.columns(3), drawn):
        with col:
            # "n = 8" in no-break spaces: a title wrapped to the third column keeps it on one line
            st.altair_chart(topology_chart(nodes, edges, heading=f"{kind}, n\u00a0=\u00a0{n} (theory)",
                                           subtitle=subs[kind], max_mib=top, arrows=kind.startswith("ring")),
                            key=f"learn_theory_{kind.split()[0]}")
    st.caption(f"P = {format_bytes(p_bytes)}: the gradient bytes of {plain(labels[rid])}'s model. "
               + ftop.THEORY_NOTE + ". " + NCCL_ALGO_NOTE)
    probe = next((e for w2 in windows.values() for e in w2.of_type("allreduce_probe") if e.get("fit")), None)
    fit = (probe or {}).get("fit")
    miss = fit_miss(probe, p_bytes)
    if miss:  # a fit far off its own probe near P draws no theory at P (app.frames.theory.fit_miss)
        st.caption(f"No all-reduce time chart: {miss}. A standalone `ddpviz probe` measures more sizes.")
    elif fit and fit.get("beta_bytes_per_s"):
        frame = ftop.allreduce_time_frame(p_bytes, fit["alpha_s"], fit["beta_bytes_per_s"], THEORY_SIZES,
                                          ALLREDUCE_MODELS)
        st.altair_chart(allreduce_time_chart(frame, mark_n=n, subtitle=fitted_link_words(fit, p_bytes)),
                        key="learn_theory_time")


def fitted_link_words(fit: dict, p_bytes: float) -> str:
    """The all-reduce time chart's subtitle: α and β are a ring model fitted to the probe's measured
    times over the sizes it names (not measurements themselves), and whether P lies outside them."""
    used = fit.get("points_used") or []
    where = f" at {format_bytes(min(used))}–{format_bytes(max(used))}" if used else ""
    outside = "" if not used or fit_covers(fit, [p_bytes]) else \
        f"; P = {format_bytes(p_bytes)} lies outside those sizes: extrapolated"
    same = "; with α taken as 0 ring and tree take the same time, one line over the other" \
        if fit["alpha_s"] <= 0 else ""
    # α on the fit's bound (0) was not measured: those sizes are bandwidth-bound (app.frames.theory.describe_fit)
    alpha = "α not resolved (held at 0)" if fit["alpha_s"] <= 0 else f"α = {fit['alpha_s'] * 1e6:.3g} µs"
    return (f"{alpha}, β = {fit['beta_bytes_per_s'] / 1e9:.3g} GB/s: a ring model fitted "
            f"to this set's all-reduce probe{where} (fitted, not measured){outside}{same}; the models are theory")


def lock_section(windows, labels) -> None:
    """The GIL, from the runs' own `gil` events: DP's device threads beside DDP's ranks."""
    runs = {labels[rid]: w.of_type("gil") for rid, w in windows.items() if w.mode in ("dp", "ddp")}
    states = thread_states_frame(runs)
    if states.empty:
        return
    st.subheader("The lock: DP's threads share one GIL, DDP's ranks each have their own")
    st.altair_chart(thread_states_chart(states), key="learn_lock")
    st.caption("Measured per thread from its CPU clock and the kernel's run-queue wait "
               "(/proc/self/task/<tid>/schedstat): a thread that has Python work but is neither "
               "running nor waiting for a CPU is waiting for a lock, in DP the GIL its sibling "
               "threads hold. Wide layers spend their time in kernels that release the GIL, so the "
               "GIL's dark teal part is small there; narrow, deep models (Sweeps → shape) make it large. "
               "\"Outside its timed work\" is the step's wall time less the thread's timed spans: a DP device "
               "thread waiting to be handed its next piece; a DDP rank's time outside forward, backward (its "
               "all-reduce wait included) and the optimizer step: its batch, the loss read, ddpviz's bookkeeping "
               "— and its whole backward where the backward is not metered: bucket_timing=recorder (the default "
               "on gloo: no ready mark in the rank's thread) or CUDA (backward runs in autograd's device thread).")


def body(windows, labels) -> None:
    dp = [(rid, w) for rid, w in windows.items() if w.mode == "dp"]
    ddp = [(rid, w) for rid, w in windows.items() if w.mode == "ddp"]
    drawn = []
    for rid, w in dp[:1]:
        nodes, edges = ftop.star(ftop.latest_volume(w.of_type("comm_volume")))
        drawn.append(("star", rid, nodes, edges))
    for rid, w in ddp[:1]:
        names = frames_buckets.rank_names(w.of_type("step"))
        nodes, edges = ftop.ring(ftop.latest_volume(w.of_type("comm_volume")), names)
        drawn.append(("ring", rid, nodes, edges))
    top = max((float(e["mib"].max()) for *_, e in drawn if not e.empty), default=None)
    for col, (kind, rid, nodes, edges) in zip(st.columns(2), drawn):
        with col:
            st.markdown(STAR_TEXT if kind == "star" else RING_TEXT)
            if nodes.empty:
                st.info(f"{plain(labels[rid])}: waiting for the first step's bytes…",
                        icon=":material/hourglass_empty:")
                continue
            heading = (f"{labels[rid]}: the star" if kind == "star"
                       else f"{labels[rid]}: the ring")
            sub = ("link width: bytes per step between device 0 and each device" if kind == "star"
                   else "arrows: the direction chunks travel; width: bytes per step")
            st.altair_chart(topology_chart(nodes, edges, heading=heading, subtitle=sub,
                                           max_mib=top, arrows=kind == "ring"),
                            key=f"learn_{kind}")
    lock_section(windows, labels)
    if drawn:
        theory_section(windows, labels)
    fsdp = [(rid, w) for rid, w in windows.items() if w.mode == "fsdp"]
    if fsdp:
        shards_section(fsdp, labels)
    if not drawn and not fsdp:
        st.info("Pick a set with a DP, a DDP or an FSDP run.", icon=":material/info:")
    panels.show_verdict(windows, labels)
    if any((w.started or {}).get("emulated") for w in windows.values()):
        st.caption(explain.EMULATION_NOTE)


st.title("Learn: the star, the ring and the shards")
st.caption("Where the bytes go in each strategy, drawn from your own runs.")
client = require_client()
runs = [r for r in runsets.pick_set(client, "learn_set", runsets.has_modes("dp", "ddp"))
        if runsets.mode(r) in ("dp", "ddp", "fsdp")]
runs = runsets.narrow_to_world_size(runs, "learn_ws")
if not runs:
    runsets.no_runs("DP, DDP or FSDP runs")
    st.stop()
labels = runsets.unique_labels(runs)
windows = runsets.windows_for([r["run_id"] for r in runs])
runsets.live_body(client, windows, lambda: body(windows, labels), key="learn")
