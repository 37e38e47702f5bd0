"""The Live page's panel for an FSDP run: the unit timeline and the within-step memory curve.

Drawn where a DDP run shows its buckets (`app.panels.detail_panel` calls `fsdp_detail`).
"""

from __future__ import annotations

import streamlit as st

from ddpviz.app.charts import fsdp as charts_fsdp
from ddpviz.app.frames import fsdp as frames_fsdp
from ddpviz.app.frames.base import MIB
from ddpviz.app.frames.fsdp import CPU_NOTE

VOLUME_CAPTION = ("bytes: measured tensor sizes of every all-gather and reduce-scatter × the backend's "
                  "wire factor per rank (ring all-gather (n−1)/n; reduce-scatter (n−1)/n on NCCL, "
                  "2(n−1)/n on gloo, which runs it as an all-reduce). Theory: 3(n−1)/n·P with "
                  "reshard_after_forward, 2(n−1)/n·P without (P = parameter bytes); FSDP2 keeps the "
                  "root unit gathered from forward to backward, so it is gathered once.")


def fsdp_detail(w, label: str, rid: str) -> None:
    """The latest complete step's unit timeline and rank 0's memory curve of one FSDP run."""
    events = w.of_type("fsdp_collective") + w.of_type("step")
    coll = frames_fsdp.collective_frame(events)
    if coll.empty and int(w.config.get("world_size") or 1) == 1:
        st.caption("world_size 1: the one rank holds every shard, so FSDP gathers and scatters nothing")
    elif coll.empty:
        st.info("Waiting for FSDP collective events…", icon=":material/hourglass_empty:")
        return
    else:
        _timeline(w, coll, events, rid)
    curve = frames_fsdp.memory_curve_frame(w.of_type("fsdp_memory_curve"))
    if not curve.empty:
        st.altair_chart(charts_fsdp.memory_curve_chart(curve), key=f"chart_fsdp_memory_{rid}")
        st.caption(frames_fsdp.curve_caption(curve, w.of_type("memory")))


def _timeline(w, coll, events, rid: str) -> None:
    step = int(coll["step"].iloc[0])
    st.altair_chart(charts_fsdp.unit_timeline_chart(coll, frames_fsdp.pass_frame(events, step)),
                    key=f"chart_fsdp_units_{rid}")
    r0 = coll[coll["rank"] == coll["rank"].min()]
    st.caption(f"Step {step}: {r0['unit'].nunique()} units; rank {int(r0['rank'].iloc[0])} gathered "
               f"{r0.loc[r0['lane'] == 'all-gather', 'nbytes'].sum() / MIB:.2f} MiB and reduce-scattered "
               f"{r0.loc[r0['lane'] == 'reduce-scatter', 'nbytes'].sum() / MIB:.2f} MiB of full-size "
               f"tensors this step. " + (CPU_NOTE if (w.config.get("device") != "cuda") else ""))
