"""Tune: a stored `ddpviz tune` search, its trials as runs side by side.

The answer first (the best setting with its gain, its 90% interval and the lines to paste, or
that none beat the baseline beyond noise), then every candidate's predicted and measured ratio
to the baseline, and the bucket timelines of one round's baseline beside the same round's
candidate: the two runs whose step times made that round's ratio, so the reason a setting wins
(an earlier last all-reduce, less exposed communication) is on the charts. Nothing here measures
anything: the report and the runs are what `ddpviz tune` stored (`workers.tunes`).
"""

from __future__ import annotations

import streamlit as st

from ddpviz.app import runsets
from ddpviz.app.charts.tune import ratio_chart
from ddpviz.app.connection import require_client
from ddpviz.app.frames import tune as ft
from ddpviz.app.outage import REDIS_DOWN, show_outage
from ddpviz.app.panels_buckets import side_by_side, step_selector
from ddpviz.workers.tunes import label, list_tunes

# a real script of this repository (docs/tune.md measured it): one bucket, so tune has choices
EXAMPLE = "ddpviz tune -- torchrun --nproc-per-node 2 examples/attach/train_one_bucket.py"
NO_TUNE = ("No tune stored yet. `ddpviz tune` keeps its trials (as runs) and its answer here when it reaches "
           "this app's Redis (`--url`, else `$REDIS_URL`). From the repository's folder, for example:")
_TABLE = {"predicted ratio": st.column_config.NumberColumn(format="%.3f", help="scale-out step model"),
          "measured ratio": st.column_config.NumberColumn(format="%.3f",
                                                          help="median over rounds of candidate ÷ baseline"),
          "90% interval": st.column_config.TextColumn(help="bootstrap over rounds (docs/tune.md)"),
          "loss diff": st.column_config.NumberColumn(format="%.3g", help="largest |loss − baseline's loss|, "
                                                                          "first 10 steps, any rank"),
          "check": st.column_config.TextColumn(help="does it train the same math? Each trial's note is under the "
                                                    "table"),
          "rejected": st.column_config.CheckboxColumn(help="changes the math, or its trial failed")}


def answer(rep: dict) -> None:
    """The answer line; with a best setting, its gain and interval and the lines to paste."""
    best = rep.get("best")
    if best is None:
        st.info(f"**Answer:** {rep['answer']}.", icon=":material/balance:")
        return
    st.success(f"**Answer:** {rep['answer']}.", icon=":material/speed:")
    lo, hi = best["interval"]
    st.markdown(f"**Best setting:** `{label(best['knobs'])}` — step time ×{best['ratio']:.3f} of the baseline's, "
                f"**{best['gain']:.1%} faster** (90% interval {lo:.3f}–{hi:.3f}: every round was faster). "
                "Paste into your script's `DistributedDataParallel(...)`:")
    st.code("\n".join(best["paste"]), language="python")


def trials(rep: dict) -> None:
    """The trials table, the ratio chart, the predictor's error and what was not tried."""
    st.caption(ft.baseline_text(rep))
    st.dataframe(ft.trials_frame(rep), hide_index=True, column_config=_TABLE, key="tune_table")
    st.caption(" · ".join(ft.trial_notes(rep)))
    ratios = ft.ratio_frame(rep)
    if not ratios.empty:
        st.altair_chart(ratio_chart(ratios), key="tune_ratios")
    said = ft.prediction_text(rep)
    if said:
        st.caption(said)
    for s in rep.get("skipped") or []:
        st.caption(f"Not tried: {s}")


def timelines(client, rep: dict) -> None:
    """A candidate's stored runs of one round beside the same round's baseline."""
    st.subheader("Buckets: the baseline beside a setting, in the same round")
    choices = [i for i in range(len(rep["trials"])) if ft.stored_pairs(rep, i)]
    if not choices:
        st.info("No round has both its baseline and a candidate stored as runs.", icon=":material/info:")
        return
    best = [i for i in choices if rep.get("best") and rep["trials"][i]["knobs"] == rep["best"]["knobs"]]
    i = st.selectbox("setting", choices, index=choices.index(best[0]) if best else 0,
                     format_func=lambda k: label(rep["trials"][k]["knobs"]), key=f"tune_trial_{rep['tune_id']}")
    pairs = ft.stored_pairs(rep, i)
    rnd = st.segmented_control("round", list(pairs), default=next(iter(pairs)), format_func=lambda r: f"round {r + 1}",
                               key=f"tune_round_{rep['tune_id']}_{i}", required=True)
    base_id, cand_id = pairs[rnd]
    gone = [rid for rid in (base_id, cand_id) if client.get_run(rid) is None]
    if gone:
        st.warning(f"Run(s) {', '.join(gone)} are no longer stored (the workers' retention deletes old runs).",
                   icon=":material/search_off:")
        return
    labels = {base_id: f"baseline · round {rnd + 1}", cand_id: f"{label(rep['trials'][i]['knobs'])} · round {rnd + 1}"}
    st.caption(f"Runs `{base_id}` (baseline) and `{cand_id}` (the setting), also on the Runs and Bucket "
               "timeline pages. One time scale for both: where the last all-reduce ends is the step's "
               "communication the backward pass did not hide.")
    windows = runsets.windows_for([base_id, cand_id])

    def body() -> None:
        step = step_selector(windows, "tune_step")
        if step is None:
            st.info("These runs recorded no bucket events.", icon=":material/info:")
            return
        side_by_side(windows, labels, step)

    runsets.live_body(client, windows, body, key="tune")


st.title("Tune")
st.caption("`ddpviz tune` runs your own training command as short trials under other DDP settings, taking "
           "turns with its own settings; each candidate's step time over the same round's baseline, "
           "predicted and measured, and the best setting with the line to paste.")
client = require_client()
try:
    stored = list_tunes(client.redis)
except REDIS_DOWN:
    show_outage()
    st.stop()
if not stored:
    st.info(NO_TUNE, icon=":material/info:")
    st.code(EXAMPLE, language="bash")
    st.stop()
by_id = {rep["tune_id"]: rep for rep in stored}
picked = st.selectbox("Tune search (newest first)", list(by_id), format_func=lambda t: ft.tune_name(by_id[t]),
                      key="tune_pick")
rep = by_id[picked]
st.caption(f"Command: `{' '.join(rep.get('command') or [])}` · {rep.get('rounds')} round(s) · "
           f"{rep.get('steps')} steps per trial · {rep.get('elapsed_s')} s")
answer(rep)
trials(rep)
timelines(client, rep)
