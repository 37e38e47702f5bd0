"""Figure 4 (the app's data path) and the app half of figure 8 (its memory), in a fresh process.

`ddpviz bench` (workers.bench) stores synthetic runs of 1 K, 10 K and 100 K events and runs
``python -m ddpviz.app.bench_app`` on them: workers may not import the app, and a process of its own
makes the memory figure the app's alone. For each size and page this opens the page's windows
as the page does (`app.window.RunWindow`, the analysis pages' `app.runsets` sizes), reads until
caught up, and builds the page's frames and charts (`frames*` and `charts*` calls as in
app/views, each chart serialised with `to_dict()` as `st.altair_chart` does): that is `open_ms`.
Then one more step of events is appended to each run and the page refreshes (`refresh_ms`).
Memory: this process's resident set (psutil) after the imports and after every page of the
largest set is open. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Callable

import altair as alt
import pandas as pd
import psutil

from ddpviz.app import runsets
from ddpviz.app.charts import compare as charts_compare
from ddpviz.app.charts import dp as charts_dp
from ddpviz.app.charts import live as charts_live
from ddpviz.app.charts import memory as charts_memory
from ddpviz.app.charts import steps as charts
from ddpviz.app.charts.buckets import bucket_timeline, exposed_chart
from ddpviz.app.charts.theory import bandwidth_chart, time_chart
from ddpviz.app.frames import buckets as fb
from ddpviz.app.frames import dp as fd
from ddpviz.app.frames import memory as fm
from ddpviz.app.frames import steps as fsteps
from ddpviz.app.frames import theory as ft
from ddpviz.app.frames.compare import bytes_frame, compare_frame, curves_frame, peak_memory_frame, side_by_side, thin, view_of
from ddpviz.app.panels_buckets import live_bucket_timeline
from ddpviz.app.window import RunWindow

MIB = 1024 * 1024
Windows = dict[str, RunWindow]


def _spec(chart: Any) -> dict:
    """The chart as `st.altair_chart` sends it (Streamlit's own converter: validation, Arrow data)."""
    try:
        from streamlit.elements.vega_charts import _convert_altair_to_vega_lite_spec
    except ImportError:  # another Streamlit: the public equivalent
        return chart.to_dict()
    return _convert_altair_to_vega_lite_spec(chart)


# Each page is two stages, timed apart: frames (events -> DataFrames, as app/views and
# app/panels compute them) and charts (DataFrames -> Altair -> the spec Streamlit ships).
def live_frames(ws: Windows, labels: dict[str, str]) -> dict[str, Any]:
    """app/views/live.py + app/panels.py: throughput (window + binned history), split, memory
    (the latest traced step), per-run detail."""
    parts = [fsteps.steps_frame(w.of_type("step"), labels[r]) for r, w in ws.items()]
    steps = pd.concat(parts, ignore_index=True) if parts else fsteps.steps_frame([], "")
    earlier = pd.concat([w.history.frame(labels[r]) for r, w in ws.items()], ignore_index=True)
    mems = {}
    for r, w in ws.items():
        curve = fm.memory_curve_frame(w.of_type("memory"), labels[r])
        if not curve.empty:
            events = w.of_type("memory") + w.of_type("dp_phase") + w.of_type("step")
            mems[labels[r]] = (curve, fm.memory_phase_frame(events, int(curve["step"].iloc[0])))
    detail = []
    for w in ws.values():
        if w.mode == "ddp":
            b = fb.bucket_frame(w.of_type("bucket"))
            if not b.empty:
                detail.append(("ddp", b, w))
        elif w.mode == "dp":
            detail.append(("dp", fd.dp_phase_frame(w.of_type("dp_phase")), None))
        detail.append(("volume", fsteps.comm_volume_frame(w.of_type("comm_volume")), None))
    return {"steps": steps, "earlier": earlier, "split": fsteps.split_frame(steps), "memory": mems,
            "detail": detail, "runs": list(labels.values()),
            "window": max((w.max_steps for w in ws.values()), default=0)}


def live_charts(f: dict[str, Any]) -> list[Any]:
    out = [charts_live.live_throughput_chart(f["steps"], f["earlier"], f["runs"], f["window"]),
           charts.split_chart(f["split"])]
    held = [c.loc[c["source"].isin(fm.DEVICE_SOURCES), "mib"] for c, _ in f["memory"].values()]
    y_max = max((float(h.max()) for h in held if not h.empty), default=None)
    for label, (curve, phases) in f["memory"].items():
        out += charts_memory.memory_curve_charts(curve, phases, label, y_max)
    for kind, df, w in f["detail"]:
        if df.empty:
            continue
        out.append(live_bucket_timeline(w, df) if kind == "ddp" else
                   charts_dp.dp_phase_chart(df) if kind == "dp" else charts.comm_volume_chart(df))
    return out


def compare_frames(ws: Windows, labels: dict[str, str]) -> dict[str, Any]:
    """app/views/compare.py's body."""
    views = [view_of(w, labels[r]) for r, w in ws.items()]
    table = compare_frame(views)
    curves = curves_frame(views)
    return {"table": table, "rows": side_by_side(table), "curves": curves,
            "split": fsteps.split_frame(curves), "peaks": peak_memory_frame(views),
            "volume": bytes_frame(views)}


def compare_charts(f: dict[str, Any]) -> list[Any]:
    out = [charts.throughput_curves_chart(f["curves"]), charts_compare.loss_chart(f["curves"]),
           charts.split_chart(f["split"]), charts_compare.speedup_chart(f["table"])]
    out += [charts_compare.peak_memory_chart(f["peaks"])] if not f["peaks"].empty else []
    out += [charts_compare.bytes_chart(f["volume"])] if not f["volume"].empty else []
    return out


def buckets_frames(ws: Windows, labels: dict[str, str]) -> dict[str, Any]:
    """app/views/buckets.py's body for the DDP runs, at the newest kept step."""
    ddp = {r: w for r, w in ws.items() if w.mode == "ddp"}
    steps = sorted(set().union(*(fb.bucket_steps(w.of_type("bucket")) for w in ddp.values())))
    runs = []
    for r, w in ddp.items() if steps else ():
        names = fb.rank_names(w.of_type("step") + w.of_type("bucket"))
        b = fb.bucket_frame(w.of_type("bucket"), steps[-1])
        exposed = fb.exposed_frame(b, w.of_type("step"))
        runs.append({"label": labels[r], "buckets": fb.with_rank_names(b, names),
                     "backward": fb.with_rank_names(fb.backward_frame(w.of_type("step"), steps[-1]), names),
                     "exposed": fb.with_rank_names(exposed, names),
                     "per_step": thin(fb.exposed_per_step(w.of_type("step"), labels[r]), 1000),
                     "layout": fb.layout_frame(((w.started or {}).get("bucket_preview") or {}).get("rebuilt")),
                     "measured": fb.measured_layouts(w.of_type("bucket"))})
    return {"runs": runs}


def buckets_charts(f: dict[str, Any]) -> list[Any]:
    out = []
    for r in f["runs"]:
        out += [bucket_timeline(r["buckets"], r["backward"], r["exposed"], run=r["label"], x_max_ms=None),
                exposed_chart(r["per_step"])]
    return out


def theory_frames(ws: Windows, labels: dict[str, str]) -> dict[str, Any]:
    """app/views/theory.py's body: per DDP run, the probe and the buckets on one size axis with
    both fitted ring models; the bytes chart."""
    fits = []
    for r, w in ws.items():
        if w.mode == "ddp":
            n = int(w.config.get("world_size") or 1)
            buckets = w.of_type("bucket")
            bk = ft.bucket_frame(buckets, n, min_step=1)
            probe = ft.latest_probe(w.of_type("allreduce_probe"))
            pf = ft.probe_frame(probe)
            if bk.empty and pf.empty:
                continue
            model, _ = ft.bucket_fit(buckets, n)
            lines = ft.model_lines({ft.FIT_PROBE: (probe or {}).get("fit"), ft.FIT_BUCKETS: model},
                                   *ft.size_range(pf, bk), n)
            fits.append((labels[r], pf, bk, lines))
    volume = bytes_frame([view_of(w, labels[r]) for r, w in ws.items() if w.mode in ("dp", "ddp")])
    return {"fits": fits, "volume": volume}


def theory_charts(f: dict[str, Any]) -> list[Any]:
    out = []
    for label, pf, bk, lines in f["fits"]:
        out += [bandwidth_chart(pf, bk, lines, run=label), time_chart(pf, bk, lines, run=label)]
    return out + ([charts_compare.bytes_chart(f["volume"])] if not f["volume"].empty else [])


# page -> (frames stage, charts stage, the modes of the set it shows, analysis windows?)
PAGES: dict[str, tuple[Callable, Callable, tuple[str, ...], bool]] = {
    "live": (live_frames, live_charts, ("dp", "ddp"), False),
    "compare": (compare_frames, compare_charts, ("single", "dp", "ddp"), True),
    "bucket_timeline": (buckets_frames, buckets_charts, ("ddp",), True),
    "theory": (theory_frames, theory_charts, ("dp", "ddp"), True),
}


def open_windows(client, ids: dict[str, str], modes: tuple[str, ...], analysis: bool) -> Windows:
    ws = {}
    for mode in modes:
        rid = ids[mode]
        ws[rid] = RunWindow(rid, max_steps=runsets.MAX_STEPS) if analysis else RunWindow(rid)
    return ws


def catch_up(client, ws: Windows, max_polls: int = 1000) -> int:
    """Poll every window until it has read all there is now; returns the polls it took."""
    polls = 0
    for w in ws.values():
        before = None
        while polls < max_polls and w.last_id != before:
            before = w.last_id
            w.poll(client)
            polls += 1
    return polls


def _stages(client, ws: Windows, labels: dict[str, str], frames_fn, charts_fn, read) -> dict[str, float]:
    t0 = time.perf_counter()
    polls = read()
    t1 = time.perf_counter()
    built = frames_fn(ws, labels)
    t2 = time.perf_counter()
    specs = [_spec(c) for c in charts_fn(built)]
    t3 = time.perf_counter()
    return {"read_ms": round((t1 - t0) * 1e3, 1), "frames_ms": round((t2 - t1) * 1e3, 1),
            "charts_ms": round((t3 - t2) * 1e3, 1), "total_ms": round((t3 - t0) * 1e3, 1),
            "polls": polls, "charts": len(specs)}


def measure_page(client, name: str, ids: dict[str, str], append: Callable[[list[str]], None]):
    """{open: stages, refresh: stages, events_kept} of page `name` on the set `ids`, and its windows.

    open: new windows read until caught up, frames, charts. refresh: one more step of events
    appended to each run, one poll, frames, charts."""
    frames_fn, charts_fn, modes, analysis = PAGES[name]
    labels = {ids[m]: m.upper() for m in modes}
    ws = open_windows(client, ids, modes, analysis)
    opened = _stages(client, ws, labels, frames_fn, charts_fn, lambda: catch_up(client, ws))
    append(list(ws))

    def one_poll() -> int:
        for w in ws.values():
            w.poll(client)
        return 1

    refreshed = _stages(client, ws, labels, frames_fn, charts_fn, one_poll)
    kept = sum(len(v) for w in ws.values() for v in w.events.values())
    return {"open": opened, "refresh": refreshed, "events_kept": kept}, ws


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--redis-url", required=True)
    p.add_argument("--sets", required=True, help='JSON list of {"events": N, "single": id, "dp": id, "ddp": id}')
    args = p.parse_args(argv)
    from ddpviz.workers.bench.synthetic import step_events
    from ddpviz.workers.client import DdpvizClient
    from ddpviz.workers.sink import RedisStreamWriter

    alt.data_transformers.disable_max_rows()  # Streamlit ships whole frames too
    rss = psutil.Process(os.getpid()).memory_info
    client = DdpvizClient(url=args.redis_url)
    base_rss = rss().rss
    sets = json.loads(args.sets)
    modes = {rid: m for s in sets for m, rid in s.items() if m != "events"}
    next_step: dict[str, int] = {}

    def append(run_ids: list[str]) -> None:
        for rid in run_ids:
            steps = client.get_run(rid)["config"]["steps"]
            step = next_step.setdefault(rid, steps)
            next_step[rid] += 1
            RedisStreamWriter(client.redis, rid).write_batch(step_events(rid, modes[rid], step, time.time()))

    out: dict[str, Any] = {"pages": {}, "rss_after_imports_mib": round(base_rss / MIB, 1)}
    kept: list[Windows] = []
    for s in sorted(sets, key=lambda s: s["events"]):
        for name in PAGES:
            got, ws = measure_page(client, name, s, append)
            out["pages"].setdefault(name, {})[str(s["events"])] = got
            if s is max(sets, key=lambda s: s["events"]):
                kept.append(ws)  # held, as open pages hold them, for the memory figure
    out["rss_largest_open_mib"] = round(rss().rss / MIB, 1)
    out["largest_events"] = max(s["events"] for s in sets)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
