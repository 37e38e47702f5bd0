"""Learn: the communication patterns, drawn from the selected runs' bytes per link (DP's
measured on its copies, DDP's derived from the bytes it all-reduced, FSDP's from its collectives).

DataParallel is a star around device 0; DistributedDataParallel's all-reduce is a ring (each
drawing uses the `comm_volume` events of the run's latest step); FSDP shards every unit, gathers
it and scatters its gradients (drawn from the run's `fsdp_collective` events).
"""

from __future__ import annotations

import streamlit as st

from app import explain, runsets
from app.charts.topology import topology_chart
from app.connection import require_client
from app.frames import buckets as frames_buckets
from app.frames import topology as ftop
from app.frames.compare import compare_frame, view_of

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
    from app.charts import fsdp as charts_fsdp
    from app.frames import fsdp as frames_fsdp

    st.markdown(SHARD_TEXT)
    for rid, w in fsdp[:1]:
        shards = frames_fsdp.shard_frame(w.of_type("fsdp_collective"))
        if shards.empty:
            st.info(f"{labels[rid]}: waiting for the first step's collectives…",
                    icon=":material/hourglass_empty:")
            continue
        st.altair_chart(charts_fsdp.shard_chart(shards), key="learn_shards")
        st.caption(f"{labels[rid]}: the unit with the largest all-gather; sizes are the shard bytes "
                   "its all-gather and reduce-scatter carried (measured).")


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
                st.info(f"{labels[rid]}: waiting for the first step's bytes…",
                        icon=":material/hourglass_empty:")
                continue
            heading = (f"{labels[rid]}: the star" if kind == "star"
                       else f"{labels[rid]}: the ring")
            sub = ("link width: bytes per step between device 0 and each device" if kind == "star"
                   else "arrows: the direction chunks travel; width: bytes per step")
            st.altair_chart(topology_chart(nodes, edges, heading=heading, subtitle=sub,
                                           max_mib=top, arrows=kind == "ring"),
                            key=f"learn_{kind}")
    fsdp = [(rid, w) for rid, w in windows.items() if w.mode == "fsdp"]
    if fsdp:
        shards_section(fsdp, labels)
    if not drawn and not fsdp:
        st.info("Pick a set with a DP, a DDP or an FSDP run.", icon=":material/info:")
    why = explain.why_dp_ahead(compare_frame([view_of(w, labels[rid]) for rid, w in windows.items()]))
    if why:
        st.info(why, icon=":material/help:")
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
