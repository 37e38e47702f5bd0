"""The terminal answer of `ddpviz tune` (`workers.cli.tune`): the trials side by side, the
predictor's error, the best setting and the lines to paste (rich)."""

from __future__ import annotations

from typing import Any

from ddpviz.workers.tunes import label, note_check


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def plan_text(candidates: int, rounds: int, keep: int) -> str:
    """What the budget fits, in words: `rounds` rounds of the baseline against the `keep` candidates predicted
    fastest, of `candidates` (it read "4 candidate(s); 3 round(s) of the baseline and 4 of them fit the budget")."""
    if not candidates:
        return "no candidate setting to try"
    against = ("it" if candidates == 1 else "both of them" if keep == candidates == 2 else
               "each of them" if keep == candidates else f"the {keep} predicted fastest")
    return (f"{candidates} candidate setting{'s' * (candidates != 1)}; the budget fits {rounds} "
            f"round{'s' * (rounds != 1)} of the baseline against {against}")


def buckets_text(sizes: list[int] | None) -> str:
    """DDP's buckets in words: "1 bucket of 16.0 MiB", "3 buckets (25.0 MiB, 25.0 MiB, 1.95 MiB)" (a new user read
    the list `[16793600] bytes`, 2026-12-06); more than 6 as their count, total and range."""
    from ddpviz.engine.analysis import format_bytes

    sizes = list(sizes or [])
    if not sizes:
        return "no bucket recorded"
    if len(sizes) == 1:
        return f"1 bucket of {format_bytes(sizes[0])}"
    if len(sizes) <= 6:
        return f"{len(sizes)} buckets ({', '.join(format_bytes(n) for n in sizes)})"
    return (f"{len(sizes)} buckets, {format_bytes(sum(sizes))} in all ({format_bytes(min(sizes))} to "
            f"{format_bytes(max(sizes))})")


def print_report(rep: dict[str, Any]) -> None:
    """The terminal answer: the trials side by side, the predictor's error, the best setting."""
    from rich.console import Console
    from rich.table import Table

    con = Console()
    if not con.is_terminal:  # a pipe or a file: rich's 80 columns would fold the table
        con = Console(width=140)
    b = rep["baseline"]
    asked, got = rep["steps"], b.get("steps_recorded") or rep["steps"]
    short = (f": the script ends by itself after {got} of the {asked} steps asked, so every trial ran it to its end, "
             "writing what it writes") if got < asked else ""
    con.print(f"baseline: {b['world_size']} rank{'s' * (b['world_size'] != 1)}, step "
              f"{_fmt(b['step_time_s'] and b['step_time_s'] * 1e3)} ms (median of steady steps "
              f"{rep['warmup']}..{min(asked, got) - 1}{short}), {buckets_text(b['bucket_bytes'])}; "
              "the script's settings: "
              + ", ".join(f"{k}={v}" for k, v in (b["settings"] or {}).items()), markup=False, highlight=False,
              soft_wrap=True)
    table = Table(title=f"candidate / baseline step time, {rep['rounds']} round(s) taking turns")
    for col in ("setting", "predicted", "measured", "90% interval", "verdict", "loss diff", "check"):
        table.add_column(col, no_wrap=col in ("setting", "90% interval"))
    notes = []
    for t in rep["trials"]:
        iv, check = t["interval"], note_check(t["note"])
        if check != "same math":
            notes.append(f"{label(t['knobs'])}: {t['note']}")
        table.add_row(label(t["knobs"]), _fmt(t["predicted_ratio"]), _fmt(t["ratio"]),
                      f"{iv[0]:.3f}-{iv[1]:.3f}" if iv else "-", t["verdict"], _fmt(t["loss_max_abs_diff"], ".3g"),
                      check)
    con.print(table)
    for n in notes:
        con.print(n, markup=False, highlight=False)
    err = rep["prediction_error"]
    if err["count"]:
        con.print(f"predictor error (predicted / measured - 1) over {err['count']} trial(s): "
                  f"median |error| {err['median_abs']:.1%}, worst {err['worst']:+.1%}")
    for s in rep["skipped"]:
        con.print(f"not tried: {s}")
    con.print(rep["answer"])
    for line in (rep["best"] or {}).get("paste", []):
        con.print(f"    {line}", markup=False, highlight=False)
