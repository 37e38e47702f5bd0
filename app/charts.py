"""Pure chart builders: `DataFrame -> alt.Chart`, one per panel of the Live page.

Each takes the output of the matching `app.frames` function and returns a chart with a title,
axis titles carrying units and a legend, so it can be checked through `chart.to_dict()` without
a browser. Colours are fixed per category (phases, timeline kinds) so two runs read the same.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from app.frames import DP_PHASES, SPLIT_PARTS

WIDTH = "container"
HEIGHT = 260
_PHASE_COLOURS = ["#9467bd", "#8c564b", "#1f77b4", "#e377c2", "#7f7f7f", "#ff7f0e", "#d62728",
                  "#2ca02c"]
_SPLIT_COLOURS = ["#1f77b4", "#ff7f0e", "#d62728", "#2ca02c", "#c7c7c7"]
_TIMELINE_KINDS = ["backward (compute)", "all-reduce (one bucket)", "bucket ready"]
_TIMELINE_COLOURS = ["#c6dbef", "#d62728", "#000000"]


def _legend(title: str, orient: str = "bottom") -> alt.Legend:
    return alt.Legend(title=title, orient=orient)


def _title(text: str, subtitle: str | None = None) -> alt.TitleParams:
    return alt.TitleParams(text=text, subtitle=subtitle or "", anchor="start")


def throughput_chart(steps: pd.DataFrame) -> alt.Chart:
    """Samples/s per optimizer step, one line per run (`frames.steps_frame` rows)."""
    return alt.Chart(steps).mark_line(point=alt.OverlayMarkDef(size=12), strokeWidth=1.5).encode(
        x=alt.X("step:Q", title="optimizer step"),
        y=alt.Y("samples_per_s:Q", title="throughput (samples/s)"),
        color=alt.Color("run:N", legend=_legend("run")),
        tooltip=[alt.Tooltip("run:N"), alt.Tooltip("step:Q"),
                 alt.Tooltip("samples_per_s:Q", title="samples/s", format=",.0f"),
                 alt.Tooltip("step_time_ms:Q", title="step time (ms)", format=".2f")],
    ).properties(title=_title("Throughput per step", "global samples / step time"),
                 width=WIDTH, height=HEIGHT)


def split_chart(split: pd.DataFrame) -> alt.Chart:
    """Median step time per run, stacked by part (`frames.split_frame` rows), in ms."""
    return alt.Chart(split).mark_bar(height=alt.RelativeBandSize(0.6)).encode(
        x=alt.X("sum(ms):Q", title="median time per step (ms)", stack="zero"),
        y=alt.Y("run:N", title="run"),
        color=alt.Color("part:N", legend=_legend("part of the step"),
                        scale=alt.Scale(domain=SPLIT_PARTS, range=_SPLIT_COLOURS),
                        sort=SPLIT_PARTS),
        order=alt.Order("order:Q"),
        tooltip=[alt.Tooltip("run:N"), alt.Tooltip("part:N"),
                 alt.Tooltip("ms:Q", title="median (ms)", format=".2f")],
    ).properties(title=_title("Step time split", "median over the window; exposed comm = "
                              "all-reduce time not hidden behind backward"),
                 width=WIDTH, height=max(90, 55 * max(1, split["run"].nunique())))


def memory_chart(memory: pd.DataFrame) -> alt.FacetChart:
    """Allocated MiB per device over optimizer steps, one panel per run (`frames.memory_frame`)."""
    base = alt.Chart(memory).mark_line(point=alt.OverlayMarkDef(size=14)).encode(
        x=alt.X("step:Q", title="optimizer step"),
        y=alt.Y("allocated_mib:Q", title="allocated (MiB)"),
        color=alt.Color("device:N", legend=_legend("device")),
        tooltip=[alt.Tooltip("run:N"), alt.Tooltip("device:N"), alt.Tooltip("step:Q"),
                 alt.Tooltip("allocated_mib:Q", title="allocated (MiB)", format=".2f"),
                 alt.Tooltip("reserved_mib:Q", title="reserved (MiB)", format=".2f"),
                 alt.Tooltip("used_mib:Q", title="NVML used (MiB)", format=".0f"),
                 alt.Tooltip("source:N")],
    ).properties(width=340, height=200)
    return base.facet(column=alt.Column("run:N", title=None, header=alt.Header(labelFontSize=12))
                      ).properties(title=_title("Memory per device",
                                                "tensors each device holds (MiB); DP piles "
                                                "outputs and gradients onto device 0"))


def bucket_timeline_chart(buckets: pd.DataFrame, backward: pd.DataFrame) -> alt.LayerChart:
    """One DDP step per rank: the backward span, each bucket's all-reduce bar, a tick when ready.

    `buckets` is `frames.bucket_frame`, `backward` is `frames.backward_frame` (ms from the
    step's backward start). With overlap, red bars start while the blue backward bar still runs.
    """
    step = int(buckets["step"].iloc[0]) if not buckets.empty else None
    colour = alt.Color("kind:N", legend=_legend("what"),
                       scale=alt.Scale(domain=_TIMELINE_KINDS, range=_TIMELINE_COLOURS))
    y = alt.Y("rank:O", title="rank")
    bwd = alt.Chart(backward.assign(kind=_TIMELINE_KINDS[0])).mark_bar(
        height=alt.RelativeBandSize(0.8)).encode(
        x=alt.X("start_ms:Q", title="ms from backward start"), x2="end_ms:Q", y=y, color=colour,
        tooltip=[alt.Tooltip("rank:O"), alt.Tooltip("end_ms:Q", title="backward (ms)",
                                                    format=".2f")])
    tip = [alt.Tooltip("rank:O"), alt.Tooltip("bucket_index:Q", title="bucket"),
           alt.Tooltip("nbytes:Q", title="bytes", format=","),
           alt.Tooltip("num_params:Q", title="params (tensors)"),
           alt.Tooltip("ready_ms:Q", title="ready (ms)", format=".2f"),
           alt.Tooltip("comm_start_ms:Q", title="all-reduce start (ms)", format=".2f"),
           alt.Tooltip("comm_end_ms:Q", title="all-reduce end (ms)", format=".2f"),
           alt.Tooltip("algbw_gbps:Q", title="algbw (GB/s)", format=".3f")]
    data = buckets.assign(kind=_TIMELINE_KINDS[1])
    comm = alt.Chart(data).mark_bar(height=alt.RelativeBandSize(0.4), stroke="white",
                                    strokeWidth=0.5).encode(
        x="comm_start_ms:Q", x2="comm_end_ms:Q", y=y, color=colour, tooltip=tip)
    ready = alt.Chart(buckets.assign(kind=_TIMELINE_KINDS[2])).mark_tick(
        thickness=2, size=22).encode(x="ready_ms:Q", y=y, color=colour, tooltip=tip)
    label = f"Gradient buckets, step {step}" if step is not None else "Gradient buckets"
    return alt.layer(bwd, comm, ready).properties(
        title=_title(label, "each bucket's all-reduce vs the backward pass, per rank"),
        width=WIDTH, height=max(110, 60 * max(1, buckets["rank"].nunique() if not buckets.empty
                                              else 1)))


def dp_phase_chart(phases: pd.DataFrame) -> alt.Chart:
    """One DP step per device, bars coloured by phase (`frames.dp_phase_frame`, ms from step start)."""
    step = int(phases["step"].iloc[0]) if not phases.empty else None
    label = f"DP phases, step {step}" if step is not None else "DP phases"
    return alt.Chart(phases).mark_bar(height=alt.RelativeBandSize(0.7), stroke="white",
                                      strokeWidth=0.5).encode(
        x=alt.X("start_ms:Q", title="ms from step start"), x2="end_ms:Q",
        y=alt.Y("device:N", title="device"),
        color=alt.Color("phase:N", legend=_legend("phase"),
                        scale=alt.Scale(domain=DP_PHASES, range=_PHASE_COLOURS), sort=DP_PHASES),
        tooltip=[alt.Tooltip("device:N"), alt.Tooltip("phase:N"),
                 alt.Tooltip("dur_ms:Q", title="duration (ms)", format=".2f"),
                 alt.Tooltip("nbytes:Q", title="bytes copied", format=",")],
    ).properties(title=_title(label, "device 0 broadcasts, scatters, gathers, reduces and "
                              "steps alone; the others wait"),
                 width=WIDTH, height=max(110, 45 * max(1, phases["device"].nunique()
                                                       if not phases.empty else 1)))


def comm_volume_chart(volume: pd.DataFrame) -> alt.Chart:
    """MiB each device sent + received in the latest step, measured beside the theory."""
    long = pd.DataFrame({
        "device": list(volume["device"]) * 2,
        "which": ["measured"] * len(volume) + ["theory"] * len(volume),
        "mib": list(volume["sent_mib"] + volume["recv_mib"])
        + list(volume["theory_sent_mib"] + volume["theory_recv_mib"])})
    return alt.Chart(long).mark_bar().encode(
        x=alt.X("mib:Q", title="sent + received per step (MiB)"),
        y=alt.Y("device:N", title="device"),
        yOffset=alt.YOffset("which:N", sort=["measured", "theory"]),
        color=alt.Color("which:N", legend=_legend("bytes"),
                        scale=alt.Scale(domain=["measured", "theory"],
                                        range=["#1f77b4", "#aec7e8"])),
        tooltip=[alt.Tooltip("device:N"), alt.Tooltip("which:N"),
                 alt.Tooltip("mib:Q", title="MiB", format=".3f")],
    ).properties(title=_title("Communication per device", "DP: device 0 moves (n−1)·P; "
                              "ring all-reduce: 2(n−1)/n·P per rank"),
                 width=WIDTH, height=max(110, 50 * max(1, volume["device"].nunique())))
