"""The Live page's panels. Each draws from `RunWindow`s (bounded, already read) and never blocks.

`app/views/live.py` wraps each in its own `st.fragment(run_every=...)`; every panel first calls
`refresh`, which reads new events at most every `POLL_INTERVAL_S` whichever panel asks first.
The memory panel is in `app.panels_memory`; the bucket timeline's parts in `app.panels_buckets`.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from ddpviz.app import explain, panels_buckets, runsets
from ddpviz.app.charts import dp as charts_dp
from ddpviz.app.charts import live as charts_live
from ddpviz.app.charts import steps as charts
from ddpviz.app.frames import buckets as frames_buckets
from ddpviz.app.frames import detail
from ddpviz.app.frames import dp as fd
from ddpviz.app.frames import steps as fsteps
from ddpviz.app.frames.runs import cancel_reason
from ddpviz.app.outage import REDIS_DOWN, show_outage
from ddpviz.app.widgets import plain
from ddpviz.app.window import TERMINAL, RunWindow
from ddpviz.engine.stages import where_failed
from ddpviz.engine.verdict import MIN_STEADY_STEPS
from ddpviz.workers.heartbeat import NO_WORKER
from ddpviz.workers.sink import DEFAULT_STREAM_MAXLEN as STREAM_MAXLEN

# Windows shared by several panels are read at most this often: below the status panel's
# period (app/views/live.STATUS_REFRESH_S), so each of its runs reads what arrived since.
POLL_INTERVAL_S = 0.25
# Material icons: Streamlit ships their font, so they render where no emoji font is installed.
_BADGE = {"queued": ("gray", ":material/schedule:"), "started": ("blue", ":material/play_arrow:"),
          "succeeded": ("green", ":material/check_circle:"), "failed": ("red", ":material/error:"),
          "canceled": ("orange", ":material/stop_circle:"), "lost": ("violet", ":material/link_off:"),
          "unknown": ("gray", ":material/help:")}


def refresh(client, windows: dict[str, RunWindow]) -> None:
    """Read new events of every window (skipping ones read in the last POLL_INTERVAL_S)."""
    for w in windows.values():
        try:
            w.poll(client, min_interval_s=POLL_INTERVAL_S)
        except REDIS_DOWN:  # keep the last data on screen; the fragment's timer retries
            show_outage()
            return
        except Exception as exc:  # anything else: say so, keep the last data on screen
            st.warning(f"Could not read run {w.run_id}: {type(exc).__name__}: {exc}")


def _chart(chart, key: str) -> None:
    st.altair_chart(chart, key=key)


def _one_bucket(w: RunWindow) -> str:
    """" (one bucket: nothing to overlap)" when the run's latest complete step had a single bucket per
    rank: overlap on, yet its one all-reduce can only start after the whole backward (the tour, issue 33)."""
    done = frames_buckets.bucket_steps(w.of_type("bucket"))
    if not done or not w.config.get("overlap"):
        return ""
    ranks = [e.get("rank", 0) for e in w.of_type("bucket") if e.get("step") == done[-1]]
    return " (one bucket: nothing to overlap)" if ranks and len(ranks) == len(set(ranks)) else ""


def _waiting(what: str, windows: dict[str, RunWindow] | RunWindow) -> None:
    """"Waiting for `what`…" while a run of `windows` may still send it; once every one has ended
    and its stream is read, that none came and how each run ended (a refused pair said "Waiting for
    the first step" under two failed runs, the tour, issue 33)."""
    ws = [windows] if isinstance(windows, RunWindow) else list(windows.values())
    if ws and all(w.done for w in ws):
        ended = ", ".join(sorted({w.status for w in ws}))
        return st.caption(f"The run{'s' if len(ws) > 1 else ''} ended ({ended}) before {what} came.")
    st.info(f"Waiting for {what}…", icon=":material/hourglass_empty:")


# ---- status ------------------------------------------------------------------------------
def status_panel(client, windows: dict[str, RunWindow], labels: dict[str, str]) -> None:
    """Per run: status badge, progress (step i / steps), summary, the full error if it failed."""
    refresh(client, windows)
    for col, (rid, w) in zip(st.columns(len(windows)), windows.items()):
        with col:
            _run_status(client, w, labels[rid])


def _run_status(client, w: RunWindow, label: str) -> None:
    colour, icon = _BADGE.get(w.status, _BADGE["unknown"])
    st.markdown(f"##### {plain(label)}")
    st.badge(w.status, color=colour, icon=icon)
    if w.steps_total and not (is_attached(w) and w.status != "succeeded"):
        st.progress(min(1.0, w.steps_done / w.steps_total), text=f"step {w.steps_done} / {w.steps_total}")
    else:  # an attached run (`ddpviz run`): the script's length is known only when it ends, and a script that
        # failed or was stopped stores the steps it did as its `steps`: never "11 / 11" for a run cut short
        st.caption(f"step {w.steps_done} · attached: {' '.join(w.config.get('command') or []) or 'a script'}")
    if w.started and w.started.get("emulated"):
        st.caption(explain.EMULATION_NOTE)
    cfg = w.config
    # a mode's own knobs only: DP has no buckets and overlaps nothing (the tour, issue 33: "DP · bucket
    # cap 25.0 MiB · overlap setting on": the setting, not a measured overlap)
    knobs = (f" · reshard_after_forward {cfg.get('reshard_after_forward')} · params "
             f"{cfg.get('fsdp_param_dtype')}, reduce {cfg.get('fsdp_reduce_dtype')}"
             if cfg.get("mode") == "fsdp" else
             f" · bucket cap {frames_buckets.cap_text(cfg.get('bucket_cap_mb'))} MiB · overlap setting "
             f"{'on' if cfg.get('overlap') else 'off'}{_one_bucket(w)}"
             if cfg.get("mode") == "ddp" else "")
    known = cfg.get("global_batch_size") is not None  # an attached run's, once rank 0 has started
    st.caption(f"`{w.run_id}` · {what_trained(w)}" + (f" · global batch {cfg.get('global_batch_size')}{knobs}"
                                                      if known else ""))
    evals = w.of_type("eval")
    if evals:
        last = evals[-1]
        st.caption(f"validation accuracy **{last['val_accuracy']:.3f}** (loss {last['val_loss']:.4f}) "
                   f"at step {last['step']}, on the held-out split")
    if w.trimmed_before:
        st.warning(f"This run's event stream keeps its newest events only (at most {STREAM_MAXLEN:,}): steps "
                   f"0–{w.trimmed_before - 1} were trimmed from it, so its charts and exports start at step "
                   f"{w.trimmed_before}. Its summary (the median samples/s above, the Runs table) was computed "
                   "as it ran, over every step.", icon=":material/content_cut:")
    lost = events_lost(w)
    if lost:
        st.warning(f"{lost} event(s) of this run were lost on their way out of the training "
                   "(a failed write): its charts and summary miss them.", icon=":material/warning:")
    for e in discard_logs(w)[:1]:  # DP's one warning (engine/modes/dp/state.py)
        st.warning(f"{e['message']} ({', '.join(map(str, e.get('buffers', [])))}): real DataParallel "
                   "does the same; single-device training keeps them (measured at step "
                   f"{e.get('step')})", icon=":material/warning:")
    notes = run_notes(w)
    if notes:
        st.warning("From ddpviz in the run: " + " · ".join(notes), icon=":material/info:")
    if w.error:
        show_error(w.error, w.status, w.mode)
    if w.status == "queued" and not client.workers():
        st.warning(NO_WORKER[0].upper() + NO_WORKER[1:] + ".", icon=":material/dns:")
    if w.status in ("queued", "started") and st.button("Cancel", key=f"cancel_{w.run_id}"):
        st.toast(f"{w.run_id}: {client.cancel(w.run_id)}")


def events_lost(w: RunWindow) -> int:
    """Events the run's writers dropped: the summary's `events_lost` once it has one, else the sum
    over the `log` events that report a loss (`engine.batching.loss_event`)."""
    summary = (w.finished or {}).get("summary") or {}
    logged = sum(int(e.get("events_lost") or 0) for e in w.of_type("log"))
    return max(int(summary.get("events_lost") or 0), logged)


def run_notes(w: RunWindow) -> list[str]:
    """The run's `log` warnings that name what ddpviz could not record (a compiled forward, a rank that
    ended without closing its record, a part switched off after an error), each once, in order; DP's
    buffer warning and lost-event counts have their own boxes."""
    seen: dict[str, None] = {}
    for e in w.of_type("log"):
        if e.get("level") == "warning" and e.get("message") and "buffers_discarded" not in e \
                and not e.get("events_lost"):
            seen.setdefault(str(e["message"]), None)
    return list(seen)


def discard_logs(w: RunWindow) -> list[dict[str, Any]]:
    """DP's `log` events that say replicas' buffer updates were discarded (`buffers_discarded`)."""
    return [e for e in w.of_type("log") if "buffers_discarded" in e]


def dataset_name(w: RunWindow) -> str | None:
    """The data the run trained on: the name the dataset gave itself (a plugin brings its own,
    whatever `config.dataset` says), from `run_started`; the config's before that arrives."""
    name = (w.started or {}).get("dataset_name") or w.config.get("dataset")
    return None if name is None else str(name)  # None: an attached run's script brings its own data


def is_attached(w: RunWindow) -> bool:
    """A run recorded by `ddpviz run -- torchrun SCRIPT` (its config says `attached`)."""
    return bool(w.config.get("attached") or (w.started or {}).get("attached"))


def what_trained(w: RunWindow) -> str:
    """"<model> on <dataset>" of a launched run; an attached one has no dataset of ours, so
    "<model> from <script>" (the script `run_started` names, else the command)."""
    model = w.config.get("model")
    if is_attached(w):
        script = (w.started or {}).get("script") or " ".join(w.config.get("command") or []) or "a script"
        if model:
            return f"{model} from {script}"
        return f"attached to {script}, " + ("no DDP, DP or FSDP module seen" if w.done else "model not known yet")
    data = dataset_name(w)
    return f"{model} on {data}" if data else str(model or "model not known yet")


REFUSAL_STAGES = ("config", "pre-flight")  # engine.stages.STAGES that refuse a run before it trains


def show_error(error: dict[str, Any], status: str = "failed", mode: str | None = None) -> None:
    """A run's ending in words: canceled (why), failed or lost (where, the exception; a traceback folded)."""
    where = where_failed(error, mode)  # "pre-flight", "plugin build", "rank 1 at step 2" (engine.stages)
    where = f" ({where})" if where else ""
    if status == "canceled":  # asked for, not a failure
        st.info(f"Run canceled: {cancel_reason(error)}", icon=":material/stop_circle:")
        return
    verb = "lost" if status == "lost" else "failed"
    st.error(f"Run {verb}{where}: {error.get('exception', 'unknown error')}",
             icon=":material/error:")
    # a refusal before training (a field's rule, the pre-flight's checks) is its message: its traceback is ddpviz's
    # own frames; any other failure's traceback is kept, folded and wrapped (a new user met a pre-flight refusal
    # under an open traceback, and a hang's key line cut off at the block's right edge, 2026-12-06)
    if error.get("traceback") and error.get("stage") not in REFUSAL_STAGES:
        with st.expander("Traceback" + (f" (rank {error['rank']})" if error.get("rank") is not None else "")):
            st.code(error["traceback"], language="python", wrap_lines=True)


# ---- throughput and step split -------------------------------------------------------------
def steps_of(windows: dict[str, RunWindow], labels: dict[str, str]) -> pd.DataFrame:
    """`app.frames.steps.steps_frame` of every window, concatenated (run = label)."""
    parts = [fsteps.steps_frame(w.of_type("step"), labels[rid]) for rid, w in windows.items()]
    parts = [p for p in parts if not p.empty]
    return pd.concat(parts, ignore_index=True) if parts else fsteps.steps_frame([], "")


SAMPLES_NOT_SEEN_HELP = ("ddpviz counts samples at the forward of a DDP, DP or FSDP module; this run's steps had "
                         "none. A script can give them: ddpviz.step(samples=...) (docs/attach.md)")


def throughput_panel(client, windows: dict[str, RunWindow], labels: dict[str, str]) -> None:
    """The median samples/s of each run above its throughput over the whole run: the window's
    steps one by one, earlier ones in bins (`app.charts.live.live_throughput_chart`, zoomable)."""
    refresh(client, windows)
    steps = steps_of(windows, labels)
    if steps.empty:
        return _waiting("the first step", windows)
    # a finished run's own summary: every steady step, where the window holds its newest 500 (or a trimmed stream's)
    final = {labels[rid]: w.summary.get("samples_per_s") for rid, w in windows.items() if w.done}
    tiles = fsteps.throughput_tiles(steps, MIN_STEADY_STEPS, final)  # else the summary's steps (fsteps.steady_steps)
    for col, (run, (v, delta)) in zip(st.columns(len(tiles)), tiles.items()):
        if v != v:  # NaN: no step saw its samples (an attached script without DDP, DP or FSDP), never a 0
            col.metric(f"{plain(run)}: median samples/s", "not measured", help=SAMPLES_NOT_SEEN_HELP)
            continue
        col.metric(f"{plain(run)}: median samples/s", f"{v:,.0f}", delta=delta, delta_color="off",
                   delta_arrow="off")
    earlier = pd.concat([_segmented(w.history.frame(labels[rid]), w.unread_steps) for rid, w in windows.items()],
                        ignore_index=True)
    window = max(w.max_steps for w in windows.values())
    _zoomable(charts_live.live_throughput_chart(steps, earlier, [labels.get(r, r) for r in windows], window,
                                                runsets.modes_of(windows, labels)), "chart_throughput")
    note = ("Median samples/s: measured per step (samples / step time, the mean over ranks), the "
            "median over the steps after the first 3, leaving out the steps that carry the "
            "instrument's own work (memory tracing, DP's replica checksums), as the run's summary does; once a "
            "run has ended, its summary's own figure, over every such step.")
    if not earlier.empty:
        n = int(earlier["bin_steps"].max())
        # "up to": a wide run's window holds fewer (it reads at most so many events; a 64-device DP run's held
        # ~100 steps while this said "the newest 500", and "bins of 1 steps": a new user, 2026-12-06)
        note += (f" Steps before those drawn one by one (the newest, up to {window}) are drawn in bins of {n} "
                 f"step{'' if n == 1 else 's'}: each bin's mean samples/s and its min–max.")
    for rid, w in windows.items():
        if w.unread_steps:
            lo, hi = w.unread_steps
            note += (f" {labels[rid]}: steps {lo}–{hi} are still being read (a run opened after it ran is "
                     "read from its start and its newest events first, to open fast); the chart leaves them "
                     "blank until they arrive, within a few refreshes.")
    st.caption(note)


def _segmented(bins: pd.DataFrame, unread: tuple[int, int] | None) -> pd.DataFrame:
    """`bins` with `segment`: 0 before the steps the window has not read yet, 1 after (the dashed
    line breaks there)."""
    return bins.assign(segment=(bins["step_lo"] > unread[0]).astype(int) if unread else 0)


def verdict_panel(client, windows: dict[str, RunWindow], labels: dict[str, str]) -> None:
    """The DP vs DDP verdict of the newest pair (`app.explain.pair_verdict`): the same sentence on
    Live, Compare, Runs and Learn, from the runs' summaries."""
    refresh(client, windows)
    show_verdict(windows, labels)


VERDICT_WHY = "What decided it: the gap between the mean steps, part by part"


def show_verdict(windows: dict[str, RunWindow], labels: dict[str, str]) -> None:
    """Draw the verdict (and the one-worker note) for windows already read."""
    v, final = explain.pair_verdict(windows)
    pair = explain.newest_pair(windows)
    if v is not None and pair is not None:
        names = f"{plain(labels.get(pair[0], pair[0]))} vs {plain(labels.get(pair[1], pair[1]))}"
        box = st.success if v.leader == "ddp" else st.info
        box(f"**{explain.verdict_text(v, final)}**  \n({names}; the interval from a block bootstrap of each "
            "run's per-step samples/s)", icon=":material/balance:")
        # the parts under a fold: the box held ~15 lines of figures at 1,400 px (a reviewer's Chromium tour)
        with st.expander(VERDICT_WHY):
            st.markdown(f"{v.why()}  \n(each part measured once, what no timer covered named \"not measured\"; "
                        "the parts split the *mean* steps, while the step-split chart shows *medians*)")
    elif pair is not None and explain.waiting_text(windows):
        st.caption(explain.waiting_text(windows))
    note = explain.sequential_note(windows)
    if note:
        st.caption(note)


def accuracy_panel(client, windows: dict[str, RunWindow], labels: dict[str, str]) -> None:
    """Validation accuracy of each run at each evaluation (`eval` events, rank 0)."""
    refresh(client, windows)
    evals = pd.concat([fsteps.eval_frame(w.of_type("eval"), labels[rid]) for rid, w in windows.items()],
                      ignore_index=True)
    attached = [rid for rid, w in windows.items() if is_attached(w)]
    if evals.empty and attached:
        return _script_loss(windows, labels, attached)
    if evals.empty and all_done(windows):  # over: nothing more will come
        return st.caption("No validation accuracy: these runs recorded no evaluation (their data has no "
                          "held-out split, or they ended before their first).")
    if evals.empty:
        return _waiting("the first evaluation", windows)
    _zoomable(charts_live.accuracy_chart(evals, [labels.get(r, r) for r in windows],
                                         runsets.modes_of(windows, labels)), "chart_accuracy",
              [charts_live.ZOOM])
    same = fsteps.coinciding_runs(evals)
    if same:  # one line lies on the other: say so, or a reader takes a run for missing
        st.caption(f"{' and '.join(same)}: the same validation accuracy at every evaluation (the same math "
                   "on the same batches), so their lines lie on one another.")


def _script_loss(windows: dict[str, RunWindow], labels: dict[str, str], attached: list[str]) -> None:
    """An attached run evaluates nothing of ours: its training loss, as its script computed it."""
    steps = steps_of({rid: windows[rid] for rid in attached}, labels)
    if not steps.empty and steps["loss"].notna().any():
        _zoomable(charts_live.loss_chart(steps, [labels.get(r, r) for r in windows],
                                         runsets.modes_of(windows, labels)), "chart_loss", [charts_live.ZOOM])
    elif all_done({rid: windows[rid] for rid in attached}):  # no loss will come: say so, not how one reads
        return _waiting("a step's loss", {rid: windows[rid] for rid in attached})
    st.caption(ATTACHED_LOSS_NOTE)


ATTACHED_LOSS_NOTE = ("Attached run: the loss is the script's own training loss (what its loss function "
                      "returned, the mean over ranks, each step); the script runs no validation of ours, so there is "
                      "no validation accuracy to draw.")


def _zoomable(chart, key: str, selections: list[str] = charts_live.SELECTIONS) -> None:
    """A chart whose zoom (and legend pick) are widget state, so Streamlit keeps them when the
    data changes at the next refresh instead of resetting the view (`app.charts.live`)."""
    st.altair_chart(chart, key=key, on_select=_keep_view, selection_mode=selections)


def _keep_view() -> None:
    """on_select callback: nothing to do; listening is what makes Streamlit keep the selection."""


def split_panel(client, windows: dict[str, RunWindow], labels: dict[str, str]) -> None:
    """Stacked median step time (forward, backward, exposed comm, optimizer, other) per run."""
    refresh(client, windows)
    steps = steps_of(windows, labels)
    split = fsteps.split_frame(steps, runsets.modes_of(windows, labels))
    if split.empty:
        return _waiting("the first step", windows)
    _chart(charts.split_chart(split), "chart_split")
    missing = "".join(f" {run}: {why} (its forward and backward include it)."
                      for run, why in fsteps.unmeasured_parts(steps).items())
    st.caption(fsteps.split_note(set(split["part"])) + missing)


# ---- memory ---------------------------------------------------------------------------------
# ---- per-run detail ---------------------------------------------------------------------------
def detail_panel(client, windows: dict[str, RunWindow], labels: dict[str, str], rid: str) -> None:
    """A typical step of one run (`detail.typical_detail_step`; FSDP: the latest): DDP bucket
    timeline, FSDP unit timeline or DP phase timeline, and bytes moved."""
    refresh(client, windows)
    w = windows[rid]
    st.markdown(f"##### {plain(labels[rid])}")
    if w.mode == "ddp":
        step = detail.typical_detail_step(w.of_type("bucket"), w.of_type("step"), "bucket")
        buckets = frames_buckets.bucket_frame(w.of_type("bucket"), step)
        if buckets.empty:
            _waiting("bucket events", w)
        else:
            _chart(panels_buckets.live_bucket_timeline(w, buckets), f"chart_buckets_{rid}")
            panels_buckets.detail_caption(w, buckets)
    elif w.mode == "fsdp":
        from ddpviz.app.panels_fsdp import fsdp_detail

        fsdp_detail(w, labels[rid], rid)
    elif w.mode == "dp":
        phases = fd.dp_phase_frame(w.of_type("dp_phase"),
                                   detail.typical_detail_step(w.of_type("dp_phase"), w.of_type("step"), "dp_phase"))
        if phases.empty:
            _waiting("DP phase events", w)
        else:
            _chart(charts_dp.dp_phase_chart(phases), f"chart_phases_{rid}")
            said = detail.step_text(int(phases["step"].iloc[0]), w.of_type("step"), w.of_type("dp_phase"))
            st.caption(f"{said}; every step on the DP timeline page.")
    elif w.mode == "single":
        st.caption("single device: no communication to show")
        return
    else:  # no mode yet: an attached command before its first rank started (or that ended before: a missing script)
        return _waiting("the first rank's start", w)
    volume = fsteps.comm_volume_frame(w.of_type("comm_volume"))
    if not volume.empty:
        _chart(charts.comm_volume_chart(volume), f"chart_volume_{rid}")
        if w.mode == "fsdp":
            from ddpviz.app.panels_fsdp import VOLUME_CAPTION

            st.caption(VOLUME_CAPTION)
        else:  # each run's column says its own mode's (side by side, one caption for both read twice)
            what = ("the bytes of every tensor copied (measured). Theory (P = gradient bytes, n = devices), each "
                    "way: device 0 sends (n−1)·P and receives as much, the others P." if w.mode == "dp" else
                    "the bucket bytes handed to all-reduce (measured) × 2(n−1)/n (derived, ring all-reduce). "
                    "Theory (P = gradient bytes, n = devices): 2(n−1)/n·P per rank each way.")
            hook = w.config.get("comm_hook")
            if w.mode == "ddp" and hook and hook != "none":  # the theory is the uncompressed all-reduce's
                what += (f" This run's {hook} all-reduces its own, compressed tensors: the measured bars are "
                         "those; the theory is what DDP's own all-reduce of the gradients would send.")
            st.caption(f"{w.mode.upper()}: {what} The bars add sent and received, labelled by the source their "
                       "events give (unlabelled: an older run's, which give none).")


def all_done(windows: dict[str, RunWindow]) -> bool:
    """True when every run is terminal and its stream fully read."""
    return all(w.done for w in windows.values())


def is_terminal(status: str) -> bool:
    return status in TERMINAL
