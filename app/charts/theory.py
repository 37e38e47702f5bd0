"""Chart builders of the Theory page (pure: `DataFrame -> alt.Chart`).

Both charts put the all-reduce probe, the in-run buckets and the fitted ring models on the same
log-size axis; every series says in the legend whether it is measured or a fitted model.
Bytes through each device (DP's hub vs DDP's ring) reuse `app.charts.compare.bytes_chart`.
"""

from __future__ import annotations

import json

import altair as alt
import pandas as pd

from ddpviz.app.charts.style import HEIGHT, THEORY_HUES, WIDTH, legend, title
from ddpviz.app.frames.theory import ALONE, FIT_BUCKETS, FIT_PROBE, OVERLAPPED, PROBE_ALG, PROBE_BUS, PROBE_TIME, SERIES

_COLOURS = {PROBE_BUS: THEORY_HUES["probe"], PROBE_TIME: THEORY_HUES["probe"], PROBE_ALG: THEORY_HUES["probe algbw"],
            ALONE: THEORY_HUES["alone"], OVERLAPPED: THEORY_HUES["overlapped"], FIT_PROBE: THEORY_HUES["fit probe"],
            FIT_BUCKETS: THEORY_HUES["fit buckets"]}
_X = alt.X("kib:Q", title="message size (KiB, log scale)", scale=alt.Scale(type="log"))


def _marks_note(probe: pd.DataFrame, buckets: pd.DataFrame, lines: pd.DataFrame) -> str:
    """The subtitle's words on the marks, for the marks drawn only: the dashed fitted models, the probe's
    filled (fitted) and hollow points, the hollow ochre overlapped buckets."""
    said = ["Dashed: fitted models, drawn over every size"] if not lines.empty else []
    if not probe.empty and "fitted" in probe:
        fitted = probe["fitted"].astype(bool)
        said.append("filled probe points were fitted, hollow not" if not fitted.all() else
                    "every probe point was fitted")
    if not buckets.empty and not buckets["alone"].astype(bool).all():
        said.append("hollow ochre: overlapped buckets")
    return "; ".join(said)[:1].upper() + "; ".join(said)[1:] + "." if said else ""


# Each series' legend symbol as its marks are drawn (one legend merges every layer's, and Vega-Lite drew
# every entry as a filled circle, the fitted models' dashed lines too): a line for a series drawn as a line
# only, dashed as the fitted models are; a ring for the overlapped buckets (hollow points); a filled circle
# for the others (the probe's points on its line, fitted ones filled; the buckets that ran alone).
_DASH = [6, 3]  # the fitted models' strokeDash, on the chart and in the legend
# a ring (outer circle one way, inner the other: filled, the middle stays empty): Vega-Lite fills every
# symbol of a legend whose layers hold filled points, whatever its `symbolFillColor`
RING = "M-1,0A1,1 0 1,1 1,0A1,1 0 1,1 -1,0ZM-0.6,0A0.6,0.6 0 1,0 0.6,0A0.6,0.6 0 1,0 -0.6,0Z"
_LINE, _DASHED = dict(shape="stroke", dash=[]), dict(shape="stroke", dash=_DASH)
_DOT, _RING_DOT = dict(shape="circle", dash=[]), dict(shape=RING, dash=[])
SYMBOLS = {PROBE_BUS: _DOT, PROBE_TIME: _DOT, PROBE_ALG: _LINE, ALONE: _DOT, OVERLAPPED: _RING_DOT,
           FIT_PROBE: _DASHED, FIT_BUCKETS: _DASHED}


def _per_series(what: str) -> alt.ExprRef:
    """A legend property per entry: a Vega expression looking the entry's series (`datum.value`) up in
    `SYMBOLS` (a JSON object is a Vega object literal)."""
    return alt.ExprRef(f"{json.dumps({s: v[what] for s, v in SYMBOLS.items()})}[datum.value]")


def _if_line(line, other) -> alt.ExprRef:
    """`line` for a series drawn as a line, else `other`. A test, not a lookup: Vega lays out the legend's
    symbol column with the symbols' size and stroke width, and with a lookup there it laid the labels over
    the symbols (seen in Chromium)."""
    lines = [s for s, v in SYMBOLS.items() if v["shape"] == "stroke"]
    return alt.ExprRef(f"indexof({json.dumps(lines)}, datum.value) >= 0 ? {line} : {other}")


def _colour(present: list[str]) -> alt.Color:
    domain = [s for s in SERIES if s in present]
    symbols = dict(symbolType=_per_series("shape"), symbolDash=_per_series("dash"), symbolSize=_if_line(220, 80),
                   symbolStrokeWidth=_if_line(2.5, 0), symbolStrokeColor=alt.ExprRef("scale('color', datum.value)"),
                   labelOffset=8)  # clear of the longer line symbols
    return alt.Color("series:N", legend=legend("series", orient="right", **symbols),
                     scale=alt.Scale(domain=domain, range=[_COLOURS[s] for s in domain]))


def _probe_long(probe: pd.DataFrame, y: str) -> pd.DataFrame:
    """Probe rows with a `series` column: busbw (and algbw on the bandwidth chart)."""
    if probe.empty:
        return probe.assign(series=pd.Series(dtype=str), value=pd.Series(dtype=float))
    if y == "time_ms":
        return probe.assign(series=PROBE_TIME, value=probe["time_ms"])
    bus = probe.assign(series=PROBE_BUS, value=probe["busbw_gbps"])
    alg = probe.assign(series=PROBE_ALG, value=probe["algbw_gbps"])
    return pd.concat([bus, alg], ignore_index=True)


def _marks(df: pd.DataFrame, mark: str, enc: dict, **props) -> alt.Chart:
    return getattr(alt.Chart(df), f"mark_{mark}")(**props).encode(**enc)


def _layers(probe: pd.DataFrame, buckets: pd.DataFrame, lines: pd.DataFrame, y: str,
            y_title: str) -> list[alt.Chart]:
    """The marks of either chart: `y` is "busbw_gbps" or "time_ms"."""
    pl = _probe_long(probe, y)
    pl = pl[pl["value"] > 0]
    bk = buckets.assign(value=buckets[y])
    bk = bk[bk["value"] > 0]
    ln = lines.assign(value=lines[y])
    ln = ln[ln["value"] > 0]
    colour = _colour(sorted(set(pl["series"]) | set(bk["series"]) | set(ln["series"])))
    tip = [alt.Tooltip("series:N"), alt.Tooltip("kib:Q", title="KiB", format=",.1f"),
           alt.Tooltip("value:Q", title=y_title, format=".4g")]
    enc = dict(x=_X, y=alt.Y("value:Q", title=y_title, scale=alt.Scale(type="log")), color=colour,
               tooltip=tip)
    btip = dict(enc, tooltip=tip + [alt.Tooltip("step:Q"), alt.Tooltip("rank:Q"),
                                    alt.Tooltip("bucket_index:Q", title="bucket")])
    alg, dots = pl[pl["series"] == PROBE_ALG], pl[pl["series"] != PROBE_ALG]
    fitted, alone = dots["fitted"].astype(bool), bk["alone"].astype(bool)
    layers = [(alg, "line", enc, dict(strokeWidth=3, opacity=0.7)),  # under busbw (same for n = 2)
              (dots, "line", enc, dict(strokeWidth=1.5)),
              (dots[fitted], "point", enc, dict(filled=True, size=50)),
              (dots[~fitted], "point", enc, dict(filled=False, size=50)),
              (bk[~alone], "point", btip, dict(filled=False, size=30, opacity=0.6)),
              (bk[alone], "point", btip, dict(filled=True, size=45, opacity=0.8)),  # on top
              (ln, "line", dict(enc, detail="series:N"), dict(strokeWidth=2.5, strokeDash=_DASH))]
    # no layer without data (the time chart has no algbw, a run may have no bucket alone...): an
    # empty one draws nothing and makes Vega warn "Infinite extent" for its fields
    return [_marks(df, mark, e, **props) for df, mark, e, props in layers if not df.empty]


def bandwidth_chart(probe: pd.DataFrame, buckets: pd.DataFrame, lines: pd.DataFrame, *,
                    run: str) -> alt.LayerChart:
    """busbw (and the probe's algbw) against message size: `app.frames.theory.probe_frame`,
    `bucket_frame` and `model_lines` (GB/s, log-log)."""
    layers = _layers(probe, buckets, lines, "busbw_gbps", "bandwidth (GB/s, log scale)")
    # at n = 2 the factor is 1: the probe's busbw lies on its algbw, and a reader takes one for missing
    same = (not probe.empty and {"busbw_gbps", "algbw_gbps"} <= set(probe)
            and bool((probe["busbw_gbps"] == probe["algbw_gbps"]).all()))
    return alt.layer(*layers).properties(
        title=title(f"{run}: all-reduce bandwidth vs message size",
                    "busbw = algbw · 2(n−1)/n (nccl-tests), algbw = bytes / time"
                    + (" (equal at n = 2: one line lies on the other). " if same else ". ")
                    + _marks_note(probe, buckets, lines)),
        width=WIDTH, height=HEIGHT + 60)


def time_chart(probe: pd.DataFrame, buckets: pd.DataFrame, lines: pd.DataFrame, *,
               run: str) -> alt.LayerChart:
    """All-reduce time against message size, the same series as `bandwidth_chart` (ms, log-log);
    the fitted lines are t = 2(n−1)·α + 2(n−1)/n · bytes/β."""
    layers = _layers(probe, buckets, lines, "time_ms", "all-reduce time (ms, log scale)")
    return alt.layer(*layers).properties(
        title=title(f"{run}: all-reduce time vs message size",
                    "ring model t = 2(n−1)·α + 2(n−1)/n · bytes/β. " + _marks_note(probe, buckets, lines)),
        width=WIDTH, height=HEIGHT + 60)
