"""DP timeline: DataParallel's star, one lane per device.

Every step device 0 broadcasts the weights, scatters the inputs, gathers the outputs, computes
the loss, reduces the gradients and steps the optimizer; devices 1..N-1 only run forward and
backward on their replica and wait the rest of the time. The idle gaps are drawn, and each
device's idle share written beside its lane. Under each device, the time its threads waited for the
GIL in each phase (measured by the engine from the threads' scheduler figures), and a caption with
each device's GIL share of the step.
"""

from __future__ import annotations

import streamlit as st

from ddpviz.app import runsets
from ddpviz.app.charts.dp import dp_timeline, phase_totals_chart
from ddpviz.app.connection import require_client
from ddpviz.app.frames import dp as fd
from ddpviz.app.widgets import pick_step, plain

MAX_RUNS = 2


def dp_runs(runs: list[dict]) -> list[dict]:
    dp = [r for r in runs if runsets.mode(r) == "dp"]
    if len(dp) > MAX_RUNS:
        labels = runsets.unique_labels(dp)
        keep = st.multiselect("DP runs (one or two)", [r["run_id"] for r in dp],
                              default=[r["run_id"] for r in dp[-MAX_RUNS:]],
                              max_selections=MAX_RUNS, format_func=labels.get, key="dp_pick")
        dp = [r for r in dp if r["run_id"] in keep]
    return dp


def step_selector(windows) -> int | None:
    """Opens on a typical step of the first run (`fd.typical_step`: never one slowed by the
    instrument), among the steps whose GIL wait was metered where there are any (`fd.metered_first`);
    instrumented steps say so on their button."""
    steps = sorted(set().union(*(fd.dp_steps(w.of_type("dp_phase")) for w in windows.values())))
    first = next(iter(windows.values()), None)
    typical = fd.typical_step(fd.metered_first(fd.dp_steps(first.of_type("dp_phase")), first.of_type("gil")),
                              first.of_type("step")) if first else None
    traced = set().union(*(fd.instrumented_steps(w.of_type("step")) for w in windows.values()))
    if set(steps) <= traced:  # every step carried the instrument: a note on each says nothing
        traced = set()
    return pick_step(steps, "dp_step", default=typical, notes={s: "instrumented" for s in traced})


def one_run(w, label: str, step: int) -> None:
    phases = fd.dp_phase_frame(w.of_type("dp_phase"), step)
    if phases.empty:
        st.info(f"{plain(label)}: no phases recorded for step {step}.", icon=":material/info:")
        return
    summary = fd.idle_summary(phases)
    st.altair_chart(dp_timeline(phases, fd.idle_frame(phases), summary, run=label,
                                gil=fd.gil_band_frame(phases)),
                    key=f"dp_tl_{w.run_id}")
    gil = fd.gil_share_frame(w.of_type("gil"), step)
    if not gil.empty:
        st.caption(gil_caption(gil, step))
    workers = summary[summary["device"] != summary["device"].min()]
    if not workers.empty:
        span, both = float(phases["end_ms"].max()), fd.all_idle_ms(phases)
        every = "Both devices" if len(summary) == 2 else "Every device"
        st.caption(f"Devices other than device 0 are idle {workers['idle_pct'].mean():.0f}% of "
                   f"step {step} on average; device 0 "
                   f"{summary['idle_pct'].iloc[0]:.0f}%. {every} wait {both:.1f} ms "
                   f"({100 * both / span if span else 0:.0f}% of the step): no phase runs on any "
                   "device then (the main thread between phases: Python, thread hand-offs"
                   + (", and this step's instrument work" if step in fd.instrumented_steps(w.of_type("step"))
                      else "") + ")."
                   + (" DP emulated on virtual CPU devices (real threads, real copies)."
                      if (w.started or {}).get("emulated") else ""))
    totals = fd.phase_totals(w.of_type("dp_phase"), fd.dp_steps(w.of_type("dp_phase")))
    if not totals.empty:
        st.altair_chart(phase_totals_chart(totals, run=label), key=f"dp_totals_{w.run_id}")


def gil_caption(gil, step: int) -> str:
    """'Waited for the GIL: cpu:0 38% of step 20 (median 14% over 30 steps), ...' from
    `app.frames.dp.gil_share_frame`."""
    parts = [f"{r.device} {'–' if r.step_share != r.step_share else f'{r.step_share:.0%}'} of step {step} "
             f"(median {r.median_share:.0%} over {r.steps} steps)" for r in gil.itertuples()]
    return ("Device threads waited for the GIL: " + "; ".join(parts) + ". Measured: blocked time "
            "(wall − on-CPU − run-queue wait, from each thread's schedstat) inside the phases it ran.")


def body(windows, labels) -> None:
    step = step_selector(windows)
    if step is None:
        st.info("Waiting for the first complete DP step…", icon=":material/hourglass_empty:")
        return
    for col, (rid, w) in zip(st.columns(len(windows)), windows.items()):
        with col:
            one_run(w, labels[rid], step)


st.title("DP timeline")
st.caption("DataParallel is a star: device 0 is the hub that every byte goes through, and the "
           "other devices wait while it works.")
client = require_client()
runs = dp_runs(runsets.pick_set(client, "dp_set", runsets.has_modes("dp")))
if not runs:
    runsets.no_runs("DP runs")
    st.stop()
labels = runsets.unique_labels(runs)
windows = runsets.windows_for([r["run_id"] for r in runs])
runsets.live_body(client, windows, lambda: body(windows, labels), key="dp")
