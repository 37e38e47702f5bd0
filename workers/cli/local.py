"""`ddpviz compare`, `bench`, `preview` and `probe`: engine runs here.

compare: single, DP and DDP (`--modes` adds fsdp) on one config; `--json` prints an object keyed by
mode (README, "Command line").
bench: the eight performance figures as JSON and Markdown (`workers.bench`) — the place where
speed and memory targets are checked (not timed tests).
preview: the DDP bucket layout PyTorch will use for a config, before anything launches.
probe: the all-reduce probe (engine/modes/ddp/probe.py) alone, on local gloo ranks.
"""

from __future__ import annotations

import argparse
import json
import sys


def compare_turns(given: str, modes: tuple[str, ...], steps: int) -> tuple[int | None | str, str]:
    """`--turns` as `engine.harness.compare.compare` takes it, and the sentence saying how the
    modes run: ``(N, why)`` in turns of N steps, ``(None, why)`` one after another, or
    ``("bad", error)`` naming --turns and its rule.

    ``auto`` (the default): in turns of `engine.measure.turns.pair_turn_steps(steps)` (the app's
    pair takes the same, `workers.jobs.pair`) unless "single" is among the modes (its final
    parameters are compared with every mode's, which in turns stay in the runs' processes) or no
    turn size divides `steps`; ``0``: one after another; N: in turns of N (N >= 2 dividing steps).
    """
    from ddpviz.engine.measure.turns import pair_turn_steps

    if given == "auto":
        if "single" in modes:
            return None, ("one mode after another (--turns auto: 'single' is among --modes, and its final "
                          "parameters are compared with each mode's; --turns N runs them at once in turns)")
        n, why = pair_turn_steps(steps)
        if n is None:
            return None, f"one mode after another (--turns auto: {why})"
        return n, f"{', '.join(modes)} at once, {why} (--turns auto; --turns 0 runs one after another)"
    try:
        n = int(given)
    except ValueError:
        n = -1
    if n == 0:
        return None, "one mode after another (--turns 0)"
    if n < 2 or steps % n:
        return "bad", f"--turns must be auto, 0, or an integer >= 2 dividing --steps ({steps}) (got {given})"
    return n, f"{', '.join(modes)} at once, in turns of {n} steps"


def cmd_compare(args: argparse.Namespace) -> int:
    from ddpviz.engine.config import validate_config
    from ddpviz.engine.harness.compare import ALL_MODES, compare, report_verdict
    from ddpviz.engine.summary import FSDP_HOST_BLOCKING
    from ddpviz.workers.cli.flags import run_fields

    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    bad = [m for m in modes if m not in ALL_MODES]
    if bad or not modes:
        print(f"ddpviz: error: --modes must be a comma-separated subset of {','.join(ALL_MODES)} "
              f"(got {args.modes!r})", file=sys.stderr)
        return 2
    twice = sorted({m for m in modes if modes.count(m) > 1})
    if twice:  # the report is keyed by mode: a second run of one would be trained and lost (a new user, 2026-12-06)
        print(f"ddpviz: error: --modes lists {', '.join(twice)} twice: each mode runs once (got {args.modes!r})",
              file=sys.stderr)
        return 2
    if "mode" in run_fields(args):  # compare runs every mode of --modes: a --mode was ignored, even a wrong one
        print(f"ddpviz: error: --mode: compare runs the modes of --modes (got --mode {run_fields(args)['mode']!r}); "
              f"use --modes, e.g. --modes {run_fields(args)['mode']}", file=sys.stderr)
        return 2
    # Validated as the mode that accepts every flag given (FSDP knobs need mode fsdp).
    cfg = validate_config({**run_fields(args), "mode": "fsdp" if "fsdp" in modes else "ddp"})
    turns, how = compare_turns(args.turns, modes, cfg.steps)
    if turns == "bad":
        print(f"ddpviz: error: {how}", file=sys.stderr)
        return 2
    print(f"ddpviz compare: {how}", file=sys.stderr)
    try:
        report = compare(cfg, modes=modes, turns=turns,
                         on_mode=lambda m: print(f"running {m} ...", file=sys.stderr, flush=True))
    except RuntimeError as exc:  # --turns: a run that did not succeed (which, and its error)
        print(f"ddpviz: compare failed: {exc}", file=sys.stderr)
        return 1
    v = report_verdict(report)
    if args.json:  # the verdict beside the modes: README, "Command line"
        # `verdict` only where DP and DDP both ran (null while either has too few steady steps)
        extra = {"verdict": None if v is None else v.to_json()} if {"dp", "ddp"} <= set(report) else {}
        print(json.dumps({**report, **extra}, indent=2))
    else:
        for mode, r in report.items():
            sps, up = r["samples_per_s"], r["speedup_vs_single"]
            exposed = r["step_time_split"].get("comm_exposed_s")
            exposed = r.get("comm_exposed_note") or ("-" if exposed is None else f"{exposed * 1e3:.2f} ms")
            # against single only where single ran (the tour, issue 33: "- vs single" columns without it)
            single = "single" in report and mode != "single"
            up = ("-" if up is None else f"x{up:.2f}") + " vs single  " if single else ""
            # only what all-reduces has an overlap (DP's copies and single have none: no figure, as the app)
            overlap = "" if mode not in ("ddp", "fsdp") else \
                f"overlap {'not measured' if r['overlap'] is None else format(r['overlap'], '.0%')}  "
            if mode == "fsdp" and r["overlap"] is not None:  # measured on the host clock only: CPU, gloo
                overlap = overlap.rstrip() + f" (by construction on CPU: {FSDP_HOST_BLOCKING})  "
            diff = r["max_param_diff_vs_single"]
            sync = r["replicas_in_sync"]  # None: not checked (single has one replica; FSDP holds shards)
            print(f"{mode:<6} {r['status']:<9} {sps or 0:>10.0f} samples/s  {up}"
                  + (f"{r['comm_part']} {exposed}  " if mode != "single" else f"{exposed}  ")
                  + overlap + ("" if sync is None else f"replicas in sync {sync}")
                  + (f"  max |Δθ| vs single {'-' if diff is None else format(diff, '.3g')}" if single else ""))
            gil = r.get("gil_wait_share") or {}
            if gil:  # engine.measure.gil: median share of the step each device's threads waited for the GIL
                print("       waited for the GIL: " + ", ".join(
                    f"{dev} {'-' if v is None else f'{v:.0%}'}" for dev, v in gil.items()) + " of the step")
    if v is not None:  # on stderr with --json, so stdout stays the report
        print(v.text(), file=sys.stderr if args.json else sys.stdout)
    return 0 if all(r["status"] == "succeeded" for r in report.values()) else 1


def cmd_preview(args: argparse.Namespace) -> int:
    from ddpviz.engine.components.preflight import probe_batch
    from ddpviz.engine.config import validate_config
    from ddpviz.engine.data import load_dataset
    from ddpviz.engine.models import build_model, grad_bytes, param_count
    from ddpviz.engine.modes.ddp.buckets import preview_buckets
    from ddpviz.workers.cli.flags import run_fields

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


def cmd_probe(args: argparse.Namespace) -> int:
    from ddpviz.engine.modes.ddp.probe import probe_local

    kwargs = {k: v for k, v in dict(min_bytes=args.min_bytes, max_bytes=args.max_bytes, iters=args.iters,
                                     warmup_iters=args.warmup_iters, budget_s=args.budget_s).items()
              if v is not None}
    try:
        event = probe_local(args.world_size, **kwargs)
    except ValueError as exc:  # a bad argument, refused before any process starts
        print(f"ddpviz: refused: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(event, indent=2))
        return 0
    print(f"all-reduce probe, gloo, world_size {event['world_size']}, float32, median of "
          f"{event['iters']} after {event['warmup_iters']} warm-up (max over ranks)")
    print(f"{'bytes':>12} {'time (us)':>11} {'algbw (GB/s)':>13} {'busbw (GB/s)':>13}")
    for p in event["points"]:
        print(f"{p['nbytes']:>12,} {p['time_s'] * 1e6:>11.1f} {p['algbw_bytes_per_s'] / 1e9:>13.3f} "
              f"{p['busbw_bytes_per_s'] / 1e9:>13.3f}")
    if event["skipped_nbytes"]:
        print(f"skipped by the {event['budget_s']:g} s budget: {event['skipped_nbytes']}")
    fit = event["fit"]
    if fit:
        print(f"ring model fitted to {fit['points_used'][0]:,}..{fit['points_used'][-1]:,} B "
              f"({len(fit['points_used'])} sizes, worst miss {fit['max_rel_residual']:.0%}): "
              f"alpha {fit['alpha_s'] * 1e6:.1f} us, beta {fit['beta_bytes_per_s'] / 1e9:.3f} GB/s")
    else:
        print(f"no ring model: {event.get('fit_note')}")
    return 0


def register(command, add_run_flags) -> None:
    """Add the engine commands to the `ddpviz` parser (`command` as in workers.cli.commands.build_parser)."""
    p = command("compare", cmd_compare, "run single, DP, DDP (and FSDP) on one config here and compare",
                redis=False)
    add_run_flags(p)
    p.add_argument("--json", action="store_true", help="print the report as JSON, keyed by mode")
    p.add_argument("--modes", default="single,dp,ddp", metavar="M1,M2,...",
                   help="modes to run, comma-separated, from single,dp,ddp,fsdp (default: single,dp,ddp)")
    p.add_argument("--turns", default="auto", metavar="auto|0|N",
                   help="run the modes at once, taking turns of N steps (N divides --steps), so each is "
                        "measured at the same moments of the machine; 0: one after another; auto (default): "
                        "in turns as the app's pair (10 steps, else a divisor 2..20 of --steps) unless "
                        "'single' is among --modes")
    from ddpviz.workers.bench.cli import register as register_bench

    register_bench(command)
    p = command("preview", cmd_preview, "show the DDP bucket layout for a config", redis=False)
    add_run_flags(p)
    p.add_argument("--json", action="store_true", help="print the layout as JSON")
    p = command("probe", cmd_probe, "time all-reduces of 4 KiB..64 MiB on local gloo ranks "
                "(nccl-tests style; the probe a DDP run does after training)", redis=False)
    p.add_argument("--world-size", type=int, default=2, help="rank processes (>= 2)")
    p.add_argument("--min-bytes", type=int, help="smallest message, bytes (default 4096)")
    p.add_argument("--max-bytes", type=int, help="largest message, bytes (default 67108864)")
    p.add_argument("--iters", type=int, help="timed all-reduces per size (default 10)")
    p.add_argument("--warmup-iters", type=int, help="untimed rounds first (default 3)")
    p.add_argument("--budget-s", type=float, help="seconds the probe may take (default 2)")
    p.add_argument("--json", action="store_true", help="print the allreduce_probe event as JSON")
