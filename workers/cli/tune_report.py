"""The terminal answer of `ddpviz tune` (`workers.cli.tune`): the trials side by side, the
predictor's error, the best setting and the lines to paste (rich)."""

from __future__ import annotations

from typing import Any

from ddpviz.workers.tunes import label


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def print_report(rep: dict[str, Any]) -> None:
    """The terminal answer: the trials side by side, the predictor's error, the best setting."""
    from rich.console import Console
    from rich.table import Table

    con = Console()
    if not con.is_terminal:  # a pipe or a file: rich's 80 columns would fold the table
        con = Console(width=140)
    b = rep["baseline"]
    con.print(f"baseline: {b['world_size']} rank(s), step {_fmt(b['step_time_s'] and b['step_time_s'] * 1e3)} ms "
              f"(median of steady steps {rep['warmup']}..{rep['steps'] - 1}), buckets {b['bucket_bytes']} bytes, "
              f"script's settings {b['settings']}")
    table = Table(title=f"candidate / baseline step time, {rep['rounds']} round(s) taking turns")
    for col in ("setting", "predicted", "measured", "90% interval", "verdict", "loss diff", "check"):
        table.add_column(col, no_wrap=col in ("setting", "90% interval"))
    notes = []
    for t in rep["trials"]:
        iv, check = t["interval"], t["note"].split(":")[0]
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
