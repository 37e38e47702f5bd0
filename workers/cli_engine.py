"""`ddpviz compare`, `ddpviz bench` and `ddpviz preview`: engine runs here, no Redis.

compare: single, DP and DDP on one config; `--json` prints an object keyed by mode (README, "Command line").
bench: a fixed set of configs in every mode plus the telemetry overhead, as JSON — the place
where speed and memory targets are checked (not timed tests).
preview: the DDP bucket layout PyTorch will use for a config, before anything launches.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from typing import Any

BENCH_CONFIGS: dict[str, dict[str, Any]] = {
    "mlp-digits": dict(model="mlp", width=128, depth=3, global_batch_size=64, steps=60),
    "mlp-deep": dict(model="mlp", width=64, depth=8, global_batch_size=32, steps=60),
    "gpt-text": dict(model="gpt", dataset="text", width=64, depth=4, n_head=4, block_size=64,
                     global_batch_size=16, steps=20, optimizer="adamw", lr=3e-3),
}
TELEMETRY_EVENTS = 20_000  # events emitted to measure the sink's cost per event


def cmd_compare(args: argparse.Namespace) -> int:
    from engine.compare import compare
    from engine.config import validate_config
    from workers.flags import run_fields

    cfg = validate_config({**run_fields(args), "mode": "ddp"})
    report = compare(cfg, on_mode=lambda m: print(f"running {m} ...", file=sys.stderr, flush=True))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for mode, r in report.items():
            sps, up = r["samples_per_s"], r["speedup_vs_single"]
            print(f"{mode:<6} {r['status']:<9} {sps or 0:>10.0f} samples/s  x{up or 0:.2f} vs single  "
                  f"overlap {r['overlap'] if r['overlap'] is not None else '-'}  "
                  f"in sync {r['replicas_in_sync']}  max |Δθ| vs single {r['max_param_diff_vs_single']}")
    return 0 if all(r["status"] == "succeeded" for r in report.values()) else 1


def _telemetry_cost() -> dict[str, float]:
    """Microseconds the training loop spends per emitted event (BatchingSink.emit)."""
    from engine.events import BatchingSink, ListSink, make_event

    sink = BatchingSink(ListSink())
    t0 = time.perf_counter()
    for i in range(TELEMETRY_EVENTS):
        sink.emit(make_event("step", "bench", step=i, loss=0.0))
    emit_s = time.perf_counter() - t0
    sink.close()
    return {"emit_us_per_event": emit_s / TELEMETRY_EVENTS * 1e6, "events": TELEMETRY_EVENTS}


def cmd_bench(args: argparse.Namespace) -> int:
    import torch

    from engine.config import RunConfig
    from engine.events import ListSink
    from engine.run import run_training

    names = args.only or list(BENCH_CONFIGS)
    results = []
    for name in names:
        for mode in ("single", "dp", "ddp"):
            cfg = RunConfig(mode=mode, eval_every=0, **BENCH_CONFIGS[name])
            print(f"bench {name} {mode} ...", file=sys.stderr, flush=True)
            t0 = time.time()
            r = run_training(cfg, ListSink(), f"bench-{name}-{mode}")
            s = r.summary
            results.append(dict(name=name, mode=mode, status=r.status, wall_s=time.time() - t0,
                                **{k: s.get(k) for k in ("samples_per_s", "step_time_s", "forward_s",
                                                         "backward_s", "comm_exposed_s", "optimizer_s",
                                                         "overlap", "peak_memory_bytes", "memory_imbalance")}))
    out = dict(host=platform.node(), python=platform.python_version(), torch=torch.__version__,
               cpu_count=os.cpu_count(), cuda=torch.cuda.is_available(),
               telemetry=_telemetry_cost(), results=results)
    text = json.dumps(out, indent=2)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        print(text)
    return 0 if all(r["status"] == "succeeded" for r in results) else 1


def cmd_preview(args: argparse.Namespace) -> int:
    from engine.buckets import preview_buckets
    from engine.config import validate_config
    from engine.data import load_dataset
    from engine.models import build_model, grad_bytes, param_count
    from engine.preflight import probe_batch
    from workers.flags import run_fields

    cfg = validate_config({**run_fields(args), "mode": "ddp"})
    ds = load_dataset(cfg)
    model = build_model(cfg, ds)
    p = preview_buckets(cfg, model, *probe_batch(cfg, ds))  # rank 0's first micro-batch
    if args.json:
        print(json.dumps(p, indent=2))
        return 0
    print(f"{cfg.model}: {param_count(model):,} parameters, {grad_bytes(model):,} gradient bytes; "
          f"bucket cap {p['bucket_cap_bytes']:,} B (first bucket {p['first_bucket_cap_bytes']:,} B)")
    for title, layout in (("step 0 (one bucket until DDP has seen the gradient order)", p["initial"]),
                          ("after the rebuild that follows step 0", p["rebuilt"])):
        print(title)
        for b in layout:
            names = ", ".join(b["param_names"][:4]) + (" ..." if len(b["param_names"]) > 4 else "")
            kind = "  sparse (values + indices)" if b.get("sparse") else ""
            print(f"  bucket {b['bucket_index']}: {b['nbytes']:>12,} B  {b['num_params']:>3} params  {names}{kind}")
    return 0


def register(command, add_run_flags) -> None:
    """Add the three commands to the `ddpviz` parser (`command` as in workers.cli.build_parser)."""
    p = command("compare", cmd_compare, "run single, DP and DDP on one config here and compare", redis=False)
    add_run_flags(p)
    p.add_argument("--json", action="store_true", help="print the report as JSON, keyed by mode")
    p = command("bench", cmd_bench, "benchmark every mode on fixed configs; JSON results", redis=False)
    p.add_argument("--only", nargs="*", choices=list(BENCH_CONFIGS), help="configs to run")
    p.add_argument("--out", metavar="FILE.json", help="write the results here (default: stdout)")
    p = command("preview", cmd_preview, "show the DDP bucket layout for a config", redis=False)
    add_run_flags(p)
    p.add_argument("--json", action="store_true", help="print the layout as JSON")
