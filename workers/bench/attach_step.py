"""What `ddpviz run` costs a script's small step (issue 31: <= 3% on small steps), by the script's own clock.

    python -m ddpviz.workers.bench.attach_step --rounds 8 --out docs/bench/attach-step-DATE.json

The script (`CHILD`, here): one process, world 1, gloo, DDP of an MLP 64-256-256-1, batch 32, SGD, `--steps` steps
(2,000), timing each step (forward, backward, optimizer step) with `time.perf_counter` and the training thread's
`time.thread_time`; it prints the medians of the steps after the first 300 and the process's CPU beside the
training thread's (its other threads: gloo's, ddpviz's writer and memory timer). Each round runs it plain, then
under `ddpviz run` (its default `--bucket-timing auto`: the recorder path on gloo), the order alternating by round
(ABBA); Redis is left unreachable (the events stay in the spool: the launcher's work is the same whatever the
events' fate). A round's ratio is attached / plain of the wall medians, so the machine's drift between rounds
cancels; the figure is the rounds' median with their range.

`--own-rounds N` also times ddpviz's own work on the training thread: the script, attached, wraps ddpviz's entry
points (the DDP's forward pre- and post-hooks, the backward's start and end, the optimizer step's pre- and
post-hooks; `engine.attach`) in `time.perf_counter_ns` pairs, and prints their sum per step (sampled steps
included; each pair's own ~0.5 µs too). That figure does not move with the machine's load as whole runs do.
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

NO_REDIS = "redis://127.0.0.1:1"  # nothing listens there: the run's events stay in its spool
SKIP = 300  # steps left out of the medians (start-up, DDP's bucket rebuild, the sampled steps 0-2)

# the script: argv[1] "plain", "attached" or "own" (attached, with ddpviz's entry points timed), argv[2] steps
CHILD = r'''
import collections, json, os, socket, statistics, sys, time
how, steps = sys.argv[1], int(sys.argv[2])
own = collections.Counter()
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
if how == "own":  # ddpviz is installed once torch is imported (engine/attach/startup)
    from ddpviz.engine.attach import installed
    from ddpviz.engine.attach import ddp as D
    pc = time.perf_counter_ns

    def timed(fn):
        def w(*a, **k):
            t = pc()
            try:
                return fn(*a, **k)
            finally:
                own[fn.__name__] += pc() - t
        return w

    tracker = installed().tracker
    for name in ("backward_start", "backward_end", "optimizer_start", "optimizer_end"):
        setattr(tracker, name, timed(getattr(tracker, name)))
    D.Watch._pre, D.Watch._post = timed(D.Watch._pre), timed(D.Watch._post)
torch.set_num_threads(1)
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{port}")
torch.manual_seed(0)
nn = torch.nn
model = DDP(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 64), torch.randn(32, 1)
wall, cpu = [], []
for i in range(steps):
    if i == SKIP:
        own.clear()
        p0, t0 = time.process_time_ns(), time.thread_time_ns()
    c, w = time.thread_time_ns(), time.perf_counter_ns()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    wall.append(time.perf_counter_ns() - w)
    cpu.append(time.thread_time_ns() - c)
n = steps - SKIP
others = (time.process_time_ns() - p0) - (time.thread_time_ns() - t0)
print("RESULT " + json.dumps(dict(wall_median_us=statistics.median(wall[SKIP:]) / 1e3,
                                  thread_cpu_median_us=statistics.median(cpu[SKIP:]) / 1e3,
                                  other_threads_cpu_us=others / n / 1e3,
                                  own_us={k: v / n / 1e3 for k, v in own.items()})), flush=True)
dist.destroy_process_group()
'''.replace("SKIP", str(SKIP))


def _turn(how: str, steps: int, spool: Path) -> dict[str, Any]:
    """One run of `CHILD` (`how`: "plain", "attached", "own"); its printed figures. Raises RuntimeError if it fails."""
    child = [sys.executable, "-c", CHILD, how, str(steps)]
    cmd = child if how == "plain" else [sys.executable, "-m", "ddpviz.workers", "run", "--url", NO_REDIS,
                                        "--spool", str(spool), "--", *child]
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DDPVIZ_ATTACH_OFF")}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"{how} turn exited {proc.returncode}: {proc.stderr[-2000:]}")
    return dict(json.loads(line[7:]), how=how)


def summarize(rounds: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """The figure from `rounds` (each {"plain": turn, "attached": turn}): per round attached / plain of the wall
    medians and the extra µs a step; their medians and ranges."""
    ratios = [r["attached"]["wall_median_us"] / r["plain"]["wall_median_us"] for r in rounds]
    extra = [r["attached"]["wall_median_us"] - r["plain"]["wall_median_us"] for r in rounds]
    return dict(ratio_median=statistics.median(ratios), ratio_range=[min(ratios), max(ratios)],
                ratio_per_round=[round(v, 4) for v in ratios], extra_us_median=statistics.median(extra),
                extra_us_per_round=[round(v, 1) for v in extra])


def measure(rounds: int, own_rounds: int, steps: int) -> dict[str, Any]:
    """`rounds` rounds of plain and attached turns and `own_rounds` timed attached runs (module docstring); the
    record."""
    start, load0 = time.time(), os.getloadavg()
    done: list[dict[str, dict[str, Any]]] = []
    own: list[dict[str, Any]] = []
    with TemporaryDirectory() as tmp:
        for i in range(rounds):
            order = ("plain", "attached") if i % 2 == 0 else ("attached", "plain")
            got = {how: _turn(how, steps, Path(tmp) / f"spool-{i}-{how}") for how in order}
            done.append(got)
            print(f"round {i}: plain {got['plain']['wall_median_us']:.0f} us, attached "
                  f"{got['attached']['wall_median_us']:.0f} us a step", file=sys.stderr, flush=True)
        for i in range(own_rounds):
            t = _turn("own", steps, Path(tmp) / f"spool-own-{i}")
            own.append(dict(total_us=round(sum(t["own_us"].values()), 1),
                            **{k: round(v, 1) for k, v in t["own_us"].items()}))
            print(f"own {i}: {own[-1]['total_us']} us a step", file=sys.stderr, flush=True)
    return dict(
        what="an attached script's small step under `ddpviz run` (--bucket-timing auto) against the same script "
             "plain, one process (issue 31: <= 3% on small steps)",
        command=f"python -m ddpviz.workers.bench.attach_step --rounds {rounds} --own-rounds {own_rounds} "
                f"--steps {steps}",
        script="ddpviz.workers.bench.attach_step.CHILD: world 1, gloo, DDP of an MLP 64-256-256-1, batch 32, SGD",
        date_utc=time.strftime("%Y-%m-%d %H:%M", time.gmtime(start)),
        load_average_start=[round(v, 2) for v in load0], load_average_end=[round(v, 2) for v in os.getloadavg()],
        cpus=os.cpu_count(),
        source=f"measured: the script's own perf_counter and thread_time per step, medians of steps {SKIP}+",
        **summarize(done) if done else {},
        own_time_us_per_step=dict(
            median=statistics.median([o["total_us"] for o in own]) if own else None, per_run=own,
            source="perf_counter_ns pairs around ddpviz's entry points on the training thread, summed, per step "
                   f"(steps {SKIP}+, sampled ones included)"),
        rounds=done)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--own-rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.steps <= SKIP:
        ap.error(f"--steps must be more than {SKIP} (the steps left out of the medians); got {args.steps}")
    text = json.dumps(measure(args.rounds, args.own_rounds, args.steps), indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
