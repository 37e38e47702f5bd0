"""Chart builders of the Cluster page (pure: `DataFrame -> alt.Chart`)."""

from __future__ import annotations

from typing import Any

import altair as alt
import pandas as pd

from ddpviz.app.charts.style import MEMORY_USE_HUES, MODE_COLOURS, ROW_PX, WIDTH, legend, rows_height, title

LEGEND_MODES_PX = 150  # the mode legend's four entries and title: the box never clips them


def gpu_memory_chart(gpus: pd.DataFrame) -> alt.LayerChart:
    """Used vs total memory per GPU (`app.frames.cluster.gpu_frame`), GiB, with utilisation."""
    y = alt.Y("gpu:N", title=None)
    tip = [alt.Tooltip("gpu:N"), alt.Tooltip("used_gib:Q", title="used (GiB)", format=".2f"),
           alt.Tooltip("total_gib:Q", title="total (GiB)", format=".1f"),
           alt.Tooltip("utilization_pct:Q", title="utilisation (%)")]
    total = alt.Chart(gpus.assign(what="total")).mark_bar(
        height=alt.RelativeBandSize(0.7)).encode(
        x=alt.X("total_gib:Q", title="GPU memory (GiB, NVML)"), y=y,
        color=alt.Color("what:N", legend=legend("memory"),
                        scale=alt.Scale(domain=["used", "total"], range=[MEMORY_USE_HUES["used"], MEMORY_USE_HUES["total"]])),
        tooltip=tip)
    used = alt.Chart(gpus.assign(what="used")).mark_bar(height=alt.RelativeBandSize(0.7)).encode(
        x="used_gib:Q", y=y, color=alt.Color("what:N"), tooltip=tip)
    text = alt.Chart(gpus).mark_text(align="left", dx=6, fontSize=12).encode(
        x="total_gib:Q", y=y, text=alt.Text("utilization_pct:Q", format=".0f"))
    return alt.layer(total, used, text).properties(
        title=title("GPU memory per device", "NVML device-wide used memory; number: utilisation %"),
        width=WIDTH, height=rows_height(gpus, "gpu"))


WORKER_LABEL_PX = 320  # the runs chart's worker names (a host, up's pid, a restart count)


def worker_runs_chart(runs: pd.DataFrame, window: tuple[Any, Any, str] | None = None) -> alt.Chart:
    """A bar per run on its worker's lane, start to end (`app.frames.cluster.worker_runs_frame`); runs
    that overlapped on one worker stacked in its lane by their `slot` (`yOffset`), so a DP+DDP pair, trained
    at once in turns by one job, shows two bars over the same time instead of one hiding the other.
    `window`: (start, end, words) of the time axis (local datetimes), named in the subtitle; bars that
    began before it are clipped at its edge. None: the axis fits the runs."""
    slots = int(runs["slot"].max()) + 1 if not runs.empty else 1
    span = f"the last {window[2]}" if window else "every run shown"
    t = title("Runs per worker over time", f"{span}; a bar per run; a worker's runs side by side in its lane (a "
              "DP+DDP pair trains at once, taking turns); more workers run in parallel")
    scale = alt.Scale(domain=[window[0].isoformat(), window[1].isoformat()]) if window else alt.Undefined
    return alt.Chart(runs).mark_bar(height=alt.RelativeBandSize(0.6), stroke="white", strokeWidth=1,
                                    clip=True).encode(
        x=alt.X("start:T", title="time (local, h:m:s)", axis=alt.Axis(format="%H:%M:%S"), scale=scale),
        x2="end:T",
        # whole names: cut at Vega's 180 px default, restarted workers read as three identical "vm-up8008-1-rest…"
        y=alt.Y("worker:N", title="worker", axis=alt.Axis(labelLimit=WORKER_LABEL_PX)), yOffset=alt.YOffset("slot:N"),
        color=alt.Color("mode:N", legend=legend("mode"), scale=MODE_COLOURS),
        tooltip=[alt.Tooltip("worker:N"), alt.Tooltip("run:N"), alt.Tooltip("status:N"),
                 alt.Tooltip("start:T", format="%H:%M:%S"),
                 alt.Tooltip("end:T", format="%H:%M:%S")],
    ).properties(title=t, width=WIDTH,
                 height=max(rows_height(runs, "worker", row_px=ROW_PX * slots, title_params=t), LEGEND_MODES_PX))
