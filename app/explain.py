"""Sentences the pages show beside the numbers: what CPU DP emulates, and the DP vs DDP verdict
(`engine.verdict`) of the newest pair, on every page from the same summaries.

Pure functions of run windows (no Streamlit), so they are tested directly.
"""

from __future__ import annotations

import threading
from typing import Any

from ddpviz.app.window import TERMINAL
from ddpviz.engine.summary import SummaryBuilder
from ddpviz.engine.verdict import MIN_STEADY_STEPS, Verdict, verdict

EMULATION_NOTE = (
    "DP on CPU is emulated: one process, a thread per virtual device, replicas rebuilt from "
    "device 0 every step and every tensor really copied — at RAM speed here, where a GPU box "
    "copies over PCIe or NVLink to and from device 0 while the other GPUs wait.")


def summary_of(w) -> dict[str, Any]:
    """A run's summary: its `run_finished` summary once it has one, else the same summary
    (`engine.summary.SummaryBuilder`, the same steady-step rule) built from the events the window
    holds now (its newest steps: a figure "so far"). A finished summary without the verdict's
    per-step samples (`steady_samples_per_s`, written since issue 33) gets them from the events."""
    done = (w.run or {}).get("summary") or (w.finished or {}).get("summary")
    if done and "steady_samples_per_s" in done:
        return done
    b = SummaryBuilder()
    for t in _SUMMARY_TYPES:
        for e in w.of_type(t):
            b.observe(e)
    if done:  # a summary written before it carried the verdict's samples: those from the events
        return {**b.summary(), **done} if b.steps else done
    return b.summary() if b.steps else {}


_SUMMARY_TYPES = ("step", "bucket", "gil", "dp_phase", "comm_volume", "memory", "eval", "sync", "log")


def newest_pair(windows: dict[str, Any]) -> tuple[str, str] | None:
    """(DP run id, DDP run id): the newest of each mode among `windows` (None without both)."""
    newest: dict[str, tuple[float, str]] = {}
    for rid, w in windows.items():
        created = float((w.run or {}).get("created_at") or (w.started or {}).get("ts") or 0.0)
        if w.mode in ("dp", "ddp") and created >= newest.get(w.mode, (-1.0, ""))[0]:
            newest[w.mode] = (created, rid)
    return (newest["dp"][1], newest["ddp"][1]) if len(newest) == 2 else None


_VERDICTS: dict[tuple, Verdict | None] = {}  # (run id, last event id, status) of both runs -> verdict
_VERDICTS_KEPT = 64
_VERDICTS_LOCK = threading.Lock()  # Streamlit runs each browser session's script in a thread of its own


def pair_verdict(windows: dict[str, Any]) -> tuple[Verdict | None, bool]:
    """The DP vs DDP verdict of the newest pair in `windows`, and whether it is final (both runs
    ended); (None, False) without a pair or before both have `engine.verdict.MIN_STEADY_STEPS`
    steady steps. Worked out again only when either run has new events (its bootstrap costs
    ~0.1 s of CPU at 300 steps, which a page refreshing every second would spend for nothing)."""
    pair = newest_pair(windows)
    if pair is None:
        return None, False
    dp, ddp = (windows[r] for r in pair)
    final = all(w.status in TERMINAL for w in (dp, ddp))
    if alone_after(dp.status, ddp.status):  # `waiting_text` says why
        return None, final
    key = tuple((w.run_id, getattr(w, "last_id", None), w.status, len(w.of_type("step")),
                 bool((w.run or {}).get("summary"))) for w in (dp, ddp))
    with _VERDICTS_LOCK:
        if key in _VERDICTS:
            return _VERDICTS[key], final
    found = verdict(summary_of(dp), summary_of(ddp))
    with _VERDICTS_LOCK:
        if len(_VERDICTS) >= _VERDICTS_KEPT:
            _VERDICTS.pop(next(iter(_VERDICTS)))
        _VERDICTS[key] = found
    return found, final


def sequential_note(windows: dict[str, Any]) -> str | None:
    """How the newest pair's two runs shared the machine: at once in turns, or one after the
    other and why (their records' ``pair`` field, `workers.jobs.pair`); for pairs submitted
    before it, whether they shared a worker."""
    pair = newest_pair(windows)
    if pair is None:
        return None
    dp, ddp = (windows[r] for r in pair)
    plan = (dp.run or {}).get("pair") or {}
    if plan.get("runs") == list(pair):
        return _pair_note(plan, dp.status, ddp.status)
    if dp.status == "started" and ddp.status == "queued":
        return "DDP waits for DP to finish: one worker runs one run at a time (start a second worker to run them together)."
    if ddp.status == "started" and dp.status == "queued":
        return "DP waits for DDP to finish: one worker runs one run at a time (start a second worker to run them together)."
    same = (dp.run or {}).get("worker") and (dp.run or {}).get("worker") == (ddp.run or {}).get("worker")
    if same:
        return ("The two ran one after the other on one worker, so neither slowed the other; the machine's "
                "load may still have changed between them.")
    return None


# the tour (issue 33): the verdict's "DP's mean step is 1.68 ms longer ... exposed -3.73 ms" above a table
# of 8.53 vs 5.84 ms and "exposed comm 1.93", with nothing saying why they differ
MEANS_AND_MEDIANS = ("The verdict above splits the gap between the runs' *mean* steps (means add up: its parts "
                     "sum to it, slow steps included); this table gives *medians* of the steady steps, which a "
                     "few slow steps (an evaluation, a preempted rank, a rare long all-reduce wait) do not move. "
                     "So the two differ where a run has such steps; the ratio in the headline compares medians.")

_EARLY = ("canceled", "failed", "lost")


def alone_after(dp_status: str | None, ddp_status: str | None) -> str | None:
    """The mode ("DP" or "DDP") that ended early (canceled, failed, lost) while the other went on, else None.
    Such a pair has no verdict: the one that went on trained its last steps alone, without the other's load,
    so the two runs' steps were not timed under the same conditions (a pair whose DP was canceled at step 110
    was judged on DP's 103 steady steps in turns against DDP's 395, 290 of them alone, and the verdict blamed
    noise: a new user, 2026-12-06)."""
    early = [m for m, s in (("DP", dp_status), ("DDP", ddp_status)) if s in _EARLY]
    return early[0] if len(early) == 1 else None


def _pair_note(plan: dict[str, Any], dp_status: str | None, ddp_status: str | None) -> str:
    """The note for a pair submitted as one job: what its plan says, and a run that ended early."""
    statuses = {"DP": dp_status, "DDP": ddp_status}
    waiting = all(s == "queued" for s in statuses.values())
    if all(s in _EARLY for s in statuses.values()):  # e.g. a pair refused before either started
        return (f"Neither run trained to its end (DP {dp_status}, DDP {ddp_status}): each run's status above "
                "says why.")
    if plan.get("turn_steps"):
        tense = "will train" if waiting else "train" if any(s == "started" for s in statuses.values()) else "trained"
        note = (f"DP and DDP {tense} at once on one worker, {plan.get('why')}, the order swapped each round: "
                "both are timed at the same moments of the machine (step times leave out the waits).")
        early = [m for m, s in statuses.items() if s in _EARLY]
        if len(early) == 1:
            other = "DDP" if early[0] == "DP" else "DP"
            note += f" {early[0]} ended early ({statuses[early[0]]}); {other} trained on alone after that."
        return note
    return (f"DP and DDP {'will run' if waiting else 'run'} one after the other on one worker: {plan.get('why')}; "
            "the machine's load may change between them.")


def verdict_text(v: Verdict, final: bool) -> str:
    """The verdict's headline as the pages' box shows it ("so far" while a run is going): who is ahead, by
    how much, its interval. What decided it (`Verdict.why`) goes under it, folded (`panels.show_verdict`)."""
    return v.headline() if final else f"So far: {v.headline()}"


def waiting_text(windows: dict[str, Any]) -> str | None:
    """Said while a pair exists but has no verdict yet (too few steady steps to judge)."""
    pair = newest_pair(windows)
    if pair is None:
        return None
    dp, ddp = (windows[r].status for r in pair)
    early = alone_after(dp, ddp)
    if early:
        other, status = ("DDP", dp) if early == "DP" else ("DP", ddp)
        return (f"No verdict: {early} ended early ({status}) and {other} trained on without it, so their steps "
                "were not timed under the same load. Launch the pair again to compare them.")
    if dp in _EARLY + ("succeeded",) and ddp in _EARLY + ("succeeded",):
        return (f"No verdict: the runs ended (DP {dp}, DDP {ddp}) before each had "
                f"{MIN_STEADY_STEPS} steady steps to judge them by.")
    return (f"No verdict yet: each run needs {MIN_STEADY_STEPS} steady steps (after warm-up, leaving "
            "out instrumented steps) before DP and DDP can be told apart from noise.")
