"""`ddpviz predict RUN_ID`: the scale-out prediction of the Scale-out page, on the command line.

    ddpviz predict RUN_ID --world-sizes 1,2,4,8 --link nvlink-h100 --json

Reads the run and its set through Redis (`workers.scaleout.report`, the page's numbers); prints
a table of predicted step time, samples/s and scaling efficiency per mode and world size, then
predicted vs measured for every real run of the same config on the same hardware (error in %;
each run that fed the fit marked), the error on the runs outside the fit with their count, then the
inputs and assumptions. Exit codes as `ddpviz`: 1 unknown run, 2 a refused setting.
"""

from __future__ import annotations

import argparse
import json
import sys

from ddpviz.engine.analysis import busiest_bytes
from ddpviz.engine.predict.presets import AS_MEASURED, COMPUTES, DEFAULT_UTILISATION, LINKS, THIS_MACHINE


def parse_world_sizes(text: str) -> list[int]:
    """"1,2,4,8" -> [1, 2, 4, 8].

    Raises:
        argparse.ArgumentTypeError: not whole numbers in 1..1024.
    """
    try:
        sizes = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"world sizes must be whole numbers separated by commas (got {text!r})")
    if not sizes or any(not 1 <= n <= 1024 for n in sizes):
        raise argparse.ArgumentTypeError(f"world sizes must be between 1 and 1024 (got {text!r})")
    return sizes


def _print_table(rep: dict) -> None:
    sc = rep["scenario"]
    # the runs the model was fitted to, by name: a single or FSDP run id calibrates on its set's DP and DDP
    # (it read "calibrated on <the single run>", a new user, 2026-12-06)
    cal = rep.get("calibration") or {}
    on = " and ".join(f"{m.upper() if m != 'single' else 'the single baseline'} {cal[m]['run_id']}"
                      for m in ("dp", "ddp", "single") if (cal.get(m) or {}).get("run_id"))
    print(f"predicted for link {sc['link']}, compute {sc['compute']} (calibrated on {on or rep['run_id']}"
          + (f"; the set of {rep['run_id']}" if rep["run_id"] not in on else "") + ")")
    print(f"{'MODE':<5} {'N':>4} {'HOSTS':>5} {'STEP (ms)':>10} {'SAMPLES/S':>11} {'EFFICIENCY':>10} "
          f"{'COMM (ms)':>10}  BYTES/STEP ON THE BUSIEST DEVICE (SENT + RECEIVED)")
    for p in rep["predictions"]:
        comm = p.get("comm_exposed_s", p.get("comm_s", 0.0))
        nbytes = busiest_bytes(p)
        print(f"{p['mode']:<5} {p['world_size']:>4} {p['nnodes']:>5} {p['step_time_s'] * 1e3:>10.3f} "
              f"{p['samples_per_s']:>11,.0f} {p['efficiency']:>10.0%} {comm * 1e3:>10.3f}  {nbytes:,.0f}")
    if rep["validation"]:
        print("\npredicted vs measured on this machine (this machine's link, measured compute)")
        print(f"{'RUN':<18} {'MODE':<5} {'N':>3} {'MEASURED/S':>11} {'PREDICTED/S':>12} {'ERROR':>7}  FIT")
        for v in rep["validation"]:
            fit = "in the fit: " + v["in_fit_reason"] if v.get("in_fit") else "out of sample"
            print(f"{v['run_id']:<18} {v['mode']:<5} {v['world_size']:>3} {v['measured_samples_per_s']:>11,.0f} "
                  f"{v['predicted_samples_per_s']:>12,.0f} {v['samples_per_s_error_pct']:>+6.1f}%  {fit}")
    from ddpviz.workers.scaleout_text import out_of_sample_line

    print(out_of_sample_line(rep))
    print("\ninputs and assumptions:")
    for line in rep["assumptions"]:
        print(f"- {line}")


def cmd_predict(args: argparse.Namespace) -> int:
    from ddpviz.workers.client import cli_client
    from ddpviz.workers.scaleout import report, scenario_from

    try:
        sc = scenario_from(args.link, inter_link_key=args.inter_link, devices_per_host=args.devices_per_host,
                           compute_key=args.compute, utilisation=args.utilisation, alpha_s=args.alpha_s,
                           beta_bytes_per_s=args.beta_bytes_per_s, dp_collectives=args.dp_collectives,
                           allreduce_algo=args.allreduce_algo)
        rep = report(cli_client(args.url), args.run_id, args.world_sizes, sc)
    except KeyError as exc:
        print(f"ddpviz: {exc.args[0]}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"ddpviz: refused: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(rep, indent=2))
    else:
        _print_table(rep)
    return 0


def register(command) -> None:
    """Add `predict` to the `ddpviz` parser (`command` as in workers.cli.commands.build_parser)."""
    p = command("predict", cmd_predict, "predict DP and DDP at other world sizes and links, "
                                        "calibrated on a measured run")
    p.add_argument("run_id", help="a finished DP or DDP run (its set's single baseline is used too)")
    p.add_argument("--world-sizes", type=parse_world_sizes, default=[1, 2, 4, 8], metavar="N,N,...",
                   help="world sizes to predict (default: 1,2,4,8)")
    p.add_argument("--link", choices=[THIS_MACHINE, *LINKS], default=THIS_MACHINE,
                   help="the link between devices of a host (default: this machine's, fitted to the run)")
    p.add_argument("--inter-link", choices=[k for k, v in LINKS.items() if v.between_hosts], default=None,
                   help="the network between hosts, for world sizes beyond --devices-per-host")
    p.add_argument("--devices-per-host", type=int, default=None, metavar="N",
                   help="devices per host (default: every world size on one host)")
    p.add_argument("--compute", choices=[AS_MEASURED, *COMPUTES], default=AS_MEASURED,
                   help="compute as measured, or a GPU's peak at --utilisation (an assumption)")
    p.add_argument("--utilisation", type=float, default=DEFAULT_UTILISATION,
                   help=f"share of the GPU's peak a step reaches (default {DEFAULT_UTILISATION})")
    p.add_argument("--alpha-s", type=float, default=None, help="your own link latency per ring step (s)")
    p.add_argument("--beta-bytes-per-s", type=float, default=None, help="your own link bandwidth (bytes/s)")
    p.add_argument("--dp-collectives", choices=["hub", "nccl"], default="hub",
                   help="DP's broadcast/reduce: n-1 copies through device 0 (hub), or NCCL's "
                        "pipelined broadcast/reduce as torch uses on GPUs with NCCL")
    p.add_argument("--allreduce-algo", choices=["ring", "tree"], default="ring",
                   help="DDP's all-reduce model (theory): ring, latency 2(n-1)·α, or NCCL's tree, "
                        "2·ceil(log2 n)·α; the same bandwidth term")
    p.add_argument("--json", action="store_true", help="print the report as JSON (the page's numbers)")
