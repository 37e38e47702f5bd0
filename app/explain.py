"""Sentences the pages show beside the numbers: what CPU DP emulates, and the DP vs DDP verdict
(`engine.verdict`) of the newest pair, on every page from the same summaries.

Pure functions of run windows (no Streamlit), so they are tested directly.
"""

from __future__ import annotations

from typing import Any

from ddpviz.app.window import TERMINAL
from ddpviz.engine.summary import SummaryBuilder
from ddpviz.engine.verdict import Verdict, verdict

EMULATION_NOTE = (
    "DP on CPU is emulated: one process, a thread per virtual device, replicas rebuilt from "
    "device 0 every step and every tensor really copied — at RAM speed here, where a GPU box "
    "copies over PCIe or NVLink to and from device 0 while the other GPUs wait.")


def summary_of(w) -> dict[str, Any]:
    """A run's summary: its `run_finished` summary once it has one, else the same summary
    (`engine.summary.SummaryBuilder`, the same steady-step rule) built from the events the window
    holds now (its newest steps: a figure "so far")."""
    done = (w.run or {}).get("summary") or (w.finished or {}).get("summary")
    if done:
        return done
    b = SummaryBuilder()
    for t in _SUMMARY_TYPES:
        for e in w.of_type(t):
            b.observe(e)
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


def pair_verdict(windows: dict[str, Any]) -> tuple[Verdict | None, bool]:
    """The DP vs DDP verdict of the newest pair in `windows`, and whether it is final (both runs
    ended); (None, False) without a pair or before both have steady steps."""
    pair = newest_pair(windows)
    if pair is None:
        return None, False
    dp, ddp = (windows[r] for r in pair)
    final = all(w.status in TERMINAL for w in (dp, ddp))
    return verdict(summary_of(dp), summary_of(ddp)), final


def sequential_note(windows: dict[str, Any]) -> str | None:
    """Said when the pair's two runs share one worker, so one waits for the other."""
    pair = newest_pair(windows)
    if pair is None:
        return None
    dp, ddp = (windows[r] for r in pair)
    if dp.status == "started" and ddp.status == "queued":
        return "DDP waits for DP to finish: one worker runs one run at a time (start a second worker to run them together)."
    if ddp.status == "started" and dp.status == "queued":
        return "DP waits for DDP to finish: one worker runs one run at a time (start a second worker to run them together)."
    same = (dp.run or {}).get("worker") and (dp.run or {}).get("worker") == (ddp.run or {}).get("worker")
    if same:
        return ("The two ran one after the other on one worker, so neither slowed the other; the machine's "
                "load may still have changed between them.")
    return None


def verdict_text(v: Verdict, final: bool) -> str:
    """The verdict as the pages show it ("so far" while a run is going)."""
    return v.text() if final else f"So far: {v.text()}"
