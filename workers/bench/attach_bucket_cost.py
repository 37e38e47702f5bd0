"""What one bucket costs an attached script per step, `ddpviz run --bucket-timing hook` against
`recorder` (issue 31), by the script's own clock.

    python -m ddpviz.workers.bench.attach_bucket_cost --rounds 3 --out docs/bench/attach-bucket-cost.json

Each turn is one `ddpviz run --bucket-timing T -- torchrun --nproc-per-node 2
examples/attach/train_deep_mlp.py`: an MLP 64 wide and 48 deep on 2 gloo ranks under two DDPs,
`bucket_cap_mb` 25 (1 bucket) and 0.01 (48: one per layer), taking turns in blocks inside the
script, which prints each one's median step time. A turn's cost per bucket is the slope
(ms at 48 buckets − ms at 1) / 47, both ranks averaged; it holds DDP's own per-bucket work
(the gloo collective) and, with `hook`, ddpviz's Python comm hook. The same slope of the rank's
CPU time per step (`median_step_cpu_ms`, every thread of the process) is kept beside it: the wall
time of a collective on 2 shared cores moves with the other processes' load, its CPU time less. The hook's own cost per bucket
is the hook turn's slope less the recorder turn's next to it (rounds alternate which goes first:
ABBA...). Redis is left unreachable on purpose for both (the events stay in the spool): the same
launcher work either way, none of it the figure's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from ddpviz.workers.connection import free_port

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "attach" / "train_deep_mlp.py"
NO_REDIS = "redis://127.0.0.1:1"  # nothing listens there: the run's events stay in its spool
TIMINGS = ("hook", "recorder")


def _turn(timing: str, spool: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "ddpviz.workers", "run", "--bucket-timing", timing, "--url", NO_REDIS,
           "--spool", str(spool), "--", sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-port", str(free_port()), str(SCRIPT), "--caps", "25,0.01"]
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DDPVIZ_ATTACH_OFF")}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{timing} turn exited {proc.returncode}: {proc.stderr[-2000:]}")
    dec, out, ranks = json.JSONDecoder(), proc.stdout, []
    at = out.find('{"rank"')
    while at >= 0:  # the two ranks' lines may interleave on torchrun's stdout
        obj, end = dec.raw_decode(out, at)
        ranks.append(obj)
        at = out.find('{"rank"', end)

    def slope(key: str) -> float:  # µs per bucket, both ranks averaged
        return statistics.mean((r["caps"][1][key] - r["caps"][0][key]) / (r["caps"][1]["buckets"] - r["caps"][0]["buckets"])
                               for r in ranks) * 1e3

    return dict(timing=timing, ranks=ranks, us_per_bucket=slope("median_step_ms"),
                cpu_us_per_bucket=slope("median_step_cpu_ms"))


def measure(rounds: int) -> dict[str, Any]:
    """`rounds` pairs of turns (module docstring); returns the record."""
    start, load0 = time.time(), os.getloadavg()
    turns: list[dict[str, Any]] = []
    hook_extra: dict[str, list[float]] = dict(wall=[], cpu=[])
    with TemporaryDirectory() as tmp:
        for i in range(rounds):
            order = TIMINGS if i % 2 == 0 else TIMINGS[::-1]
            got = {t: _turn(t, Path(tmp) / f"spool-{i}-{t}") for t in order}
            turns += [dict(got[t], round=i) for t in order]
            for kind, key in (("wall", "us_per_bucket"), ("cpu", "cpu_us_per_bucket")):
                hook_extra[kind].append(got["hook"][key] - got["recorder"][key])
            print(f"round {i}: " + ", ".join(f"{t} {got[t]['us_per_bucket']:.0f} us/bucket "
                                             f"({got[t]['cpu_us_per_bucket']:.0f} CPU)" for t in order),
                  file=sys.stderr, flush=True)
    per = {t: [x["us_per_bucket"] for x in turns if x["timing"] == t] for t in TIMINGS}
    per_cpu = {t: [x["cpu_us_per_bucket"] for x in turns if x["timing"] == t] for t in TIMINGS}
    return dict(
        what="per-bucket cost of an attached run's step, ddpviz run --bucket-timing hook vs recorder (issue 31)",
        command=f"python -m ddpviz.workers.bench.attach_bucket_cost --rounds {rounds}",
        script="examples/attach/train_deep_mlp.py --caps 25,0.01 (MLP 64 wide, 48 deep; 1 vs 48 buckets; 2 gloo ranks)",
        date_utc=time.strftime("%Y-%m-%d %H:%M", time.gmtime(start)),
        load_average_start=[round(v, 2) for v in load0], load_average_end=[round(v, 2) for v in os.getloadavg()],
        cpus=os.cpu_count(), source="measured: the medians of the step times the script printed with its own clock",
        us_per_bucket_median={t: statistics.median(v) for t, v in per.items()},
        cpu_us_per_bucket_median={t: statistics.median(v) for t, v in per_cpu.items()},
        hook_extra_us_per_bucket={k: dict(median=statistics.median(v), per_round=v) for k, v in hook_extra.items()},
        turns=turns)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    record = measure(args.rounds)
    text = json.dumps(record, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
