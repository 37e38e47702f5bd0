"""The Live page's memory panel: per run, the latest traced step's memory as it happened, and memory over
the whole run (split from `app.panels`)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from ddpviz.app.charts import memory as charts_memory
from ddpviz.app.frames import memory as fm
from ddpviz.app.panels import _chart, _waiting, refresh
from ddpviz.app.window import RunWindow


def memory_panel(client, windows: dict[str, RunWindow], labels: dict[str, str]) -> None:
    """Per run, side by side: the latest traced step as it happened (phases, bytes per device,
    process or GPU; a shared y scale) with the measured peak imbalance, and under it memory over
    the whole run per device (the memory timer's readings, `memory_readings`)."""
    refresh(client, windows)
    curves = {rid: fm.memory_curve_frame(w.of_type("memory"), labels[rid])
              for rid, w in windows.items()}
    over_run = {rid: fm.memory_over_run_frame(w.memory_history.rows(), labels[rid], w.start_ts)
                for rid, w in windows.items()}
    if all(c.empty for c in curves.values()) and all(o.empty for o in over_run.values()):
        return _waiting("the first memory readings", windows)
    held = [c.loc[c["source"].isin(fm.DEVICE_SOURCES), "mib"] for c in curves.values()]
    y_max = max((float(h.max()) for h in held if not h.empty), default=None)
    for col, (rid, curve) in zip(st.columns(len(curves)), curves.items()):
        with col:
            # one under the other, never a quarter of the page: titles and legends keep their room
            _step_memory(windows[rid], curve, labels[rid], rid, y_max)
            for i, chart in enumerate(charts_memory.memory_over_run_charts(over_run[rid], labels[rid])):
                _chart(chart, f"chart_memory_run_{rid}_{i}")
            if over_run[rid].empty and windows[rid].done:  # over: none will come
                st.caption("No memory timer readings in this run (its events carry none).")
            elif over_run[rid].empty:
                _waiting("the memory timer's readings", windows[rid])


def _step_memory(w: RunWindow, curve: pd.DataFrame, label: str, rid: str, y_max: float | None) -> None:
    if curve.empty:
        return _waiting("the first traced step's memory", w)
    events = w.of_type("memory") + w.of_type("dp_phase") + w.of_type("step")
    phases = fm.memory_phase_frame(events, int(curve["step"].iloc[0]))
    for i, chart in enumerate(charts_memory.memory_curve_charts(curve, phases, label, y_max)):
        _chart(chart, f"chart_memory_{rid}_{i}")
    caption = fm.peak_caption(fm.memory_peak_frame(w.of_type("memory"), label))
    st.caption(f"Step {int(curve['step'].iloc[0])} (memory traced: its time includes the tracing). " + (caption or ""))
