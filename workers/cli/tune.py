"""``ddpviz tune [--steps N] [--budget S] [--knobs ...] [--rounds R] [--json] -- COMMAND``.

Finds the DDP settings that make the user's own training command faster, by measurement:

1. a baseline trial: COMMAND under the attach instrumentation (the environment `ddpviz run` gives,
   `workers.cli.attach`), ended after N optimizer steps (`engine.attach.overrides`: every rank
   stops at the same step, exit 0), its events read straight from the trial's spool folder (no
   Redis);
2. candidates from its measured bucket layout and DDP settings (`engine.tune.candidates`), each
   with its predicted step-time ratio (`engine.tune.predict_ratio`), printed before any is run;
3. rounds of whole trials taking turns, baseline first then every candidate, the order reversed
   every other round, within `--budget` seconds for the whole search (`engine.tune.plan`);
4. per candidate: the ratio to the same round's baseline, its 90% interval over rounds, predicted
   beside measured, the loss check (`engine.tune.same_math`), and the best setting with the lines
   to paste, or that none beat the baseline beyond noise.

Each trial's DDP arguments are set at construction inside the ranks; the script's files are never
written by tune (the trials run in the command's own working directory, so a script that writes
files as it trains still writes them; a trial's stop skips everything the script does after its
N-th step). Spools live in a temporary folder, removed at the end. A trial that fails is reported
with the failing rank's error and the search goes on. When Redis answers (`--url`, else `ddpviz
run`'s choice) each trial's spool is first stored as a run and the report kept for the app's Tune
page (`workers.tunes`); when not, one line says that nothing is stored.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from ddpviz.workers.attached import PYTHONPATH_REPLACED
from ddpviz.workers.cli.exits import EXIT_FAILED, EXIT_OK, EXIT_REFUSED
from ddpviz.workers.tunes import TuneKeeper, label, trial_run_label

# a trial that trained without a DistributedDataParallel ddpviz saw (a one-process script): "it recorded 30 step(s),
# tune needs > 5" said nothing of why (a new user, 2026-12-06)
NO_DDP_TO_TUNE = ("no DistributedDataParallel was built under the instrumentation (the script trains without DDP, "
                  "or builds it where ddpviz does not see it): tune tries DDP's settings, so there is nothing to tune")
# what a failed trial's error says in place of `workers.attached.NO_ERROR_FILE`, which points to the terminal of
# `ddpviz run`: tune keeps the command's output to itself, and the lines that say why are its stderr's last
TRIAL_OUTPUT = "Why is in its output: its stderr's last lines follow."
KILL_GRACE_S = 5.0  # a trial past its time gets SIGTERM, then SIGKILL this long after
TRIAL_TIME_FACTOR = 4.0  # a later trial may take this many times the baseline's first one
STDERR_TAIL_LINES = 15  # of a failed trial without torchrun's error file


def _say(message: str) -> None:
    print(f"ddpviz tune: {message}", file=sys.stderr, flush=True)


def trial_env(cmd: list[str], spool: Path, knobs: dict[str, Any], steps: int,
              run_id: str | None = None) -> dict[str, str]:
    """COMMAND's environment for one trial: `ddpviz run`'s (the start-up hook, the spool; events
    carry `run_id`, else ``tune-trialN``) plus tune's variables (`engine.attach.overrides`)."""
    from ddpviz.engine.attach.overrides import COMM_HOOK_ENV, DDP_KWARGS_ENV, STOP_AFTER_ENV
    from ddpviz.workers.cli.command_env import command_env

    # every bucket timed: `engine.tune.predict_ratio` fits the link from the baseline's steady steps' all-reduces,
    # which `ddpviz run`'s default on gloo (the recorder) times on sampled steps only
    env = command_env(run_id or f"tune-{spool.name}", spool, cmd, bucket_timing="hook")
    ddp = {k: v for k, v in knobs.items() if k != "comm_hook"}
    env[DDP_KWARGS_ENV] = json.dumps(ddp)
    env[STOP_AFTER_ENV] = str(steps)
    if knobs.get("comm_hook"):
        env[COMM_HOOK_ENV] = knobs["comm_hook"]
    return env


def _read_events(spool: Path) -> list[dict[str, Any]]:
    out = []
    for path in sorted(spool.glob("events-*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut short by a killed rank
                pass
    return out


def _wait(proc: subprocess.Popen, timeout_s: float) -> str | None:
    """Wait for the trial; past `timeout_s` stop its process group. Returns why it was stopped."""
    try:
        proc.wait(timeout=max(1.0, timeout_s))
        return None
    except subprocess.TimeoutExpired:
        pass
    for sig, grace in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=grace)
            break
        except subprocess.TimeoutExpired:
            continue
    proc.wait()
    return f"stopped by tune after {timeout_s:.0f} s (the trial's time limit within --budget)"


def _ending(rc: int, killed: str | None, measured: dict, steps: int, spool: Path, err_path: Path) -> tuple[str, Any]:
    """(how the trial ended, error or None)."""
    if killed:
        got = measured.get("steps") or 0
        why = f"{got} of the {steps} step(s) it needed were recorded"
        if not got:  # e.g. `ddpviz tune -- env PYTHONPATH=... torchrun ...`: the start-up hook is gone
            why += f"; nothing of the command reported to ddpviz. {PYTHONPATH_REPLACED}"
        return killed, dict(rank=None, exception=why, traceback=None, exit_code=rc)
    if rc != 0:
        from ddpviz.workers.attached import failure

        from ddpviz.workers.attached import NO_ERROR_FILE, NO_OUTPUT_HERE

        err = failure(spool, rc)  # the failing rank's exception from torchrun's error file
        if err.get("traceback") is None and err_path.exists():
            err["stderr_tail"] = err_path.read_text(errors="replace").splitlines()[-STDERR_TAIL_LINES:]
            err["exception"] = (err.get("exception") or "").replace(NO_ERROR_FILE, TRIAL_OUTPUT).replace(
                NO_OUTPUT_HERE, TRIAL_OUTPUT)
        return f"failed: exit code {rc}", err
    if measured["stopped"] is not None:
        return f"stopped by tune after step {measured['stopped']['step']}: {measured['stopped']['how']}", None
    if measured["ddp"] is None:
        why = "exit 0 without building a DistributedDataParallel under the instrumentation"
        return why, dict(rank=None, exception=why, traceback=None, exit_code=rc)
    return f"the script ended by itself after {measured['steps']} step(s) (< {steps})", None


def run_trial(cmd: list[str], knobs: dict[str, Any], steps: int, warmup: int, timeout_s: float,
              root: Path, index: int, run_id: str | None = None,
              keep: Callable[[Path, dict[str, Any]], str | None] | None = None) -> dict[str, Any]:
    """One trial of COMMAND under `knobs`; its spool is removed once read, and first handed to
    `keep` (which stores it as run `run_id`, the id its events carry, and returns it or None).

    Returns:
        ``{index, knobs, exit_code, started_at, wall_s, ended, error, measured, run_id}``
        (`engine.tune.measure_trial`; `run_id` None when the trial was not stored).
    """
    from ddpviz.engine.tune import measure_trial

    spool = root / f"trial{index}"
    spool.mkdir(mode=0o700)
    out_path, err_path = spool / "stdout.txt", spool / "stderr.txt"
    started_at, t0 = time.time(), time.monotonic()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(cmd, env=trial_env(cmd, spool, knobs, steps, run_id), stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            killed = _wait(proc, timeout_s)
        except BaseException:  # Ctrl-C: no trial outlives tune
            _wait(proc, 0)
            raise
    wall = time.monotonic() - t0
    measured = measure_trial(_read_events(spool), warmup)
    ended, error = _ending(proc.returncode, killed, measured, steps, spool, err_path)
    trial = dict(index=index, knobs=knobs, exit_code=proc.returncode, started_at=started_at, wall_s=wall,
                 ended=ended, error=error, measured=measured)
    trial["run_id"] = keep(spool, trial) if keep is not None else None
    shutil.rmtree(spool, ignore_errors=True)
    return trial


def usable(trial: dict[str, Any], warmup: int) -> bool:
    """A trial whose steady step time can be compared (not failed, steps past warmup)."""
    return trial["error"] is None and trial["measured"]["step_time_s"] is not None


class Search:
    """One `ddpviz tune`: the trials run so far and the budget left; `keeper` stores each trial as
    a run (`workers.tunes.TuneKeeper`), or None."""

    def __init__(self, cmd: list[str], steps: int, warmup: int, budget_s: float, root: Path,
                 keeper: TuneKeeper | None = None):
        self.cmd, self.steps, self.warmup, self.budget_s, self.root = cmd, steps, warmup, budget_s, root
        self.keeper = keeper
        self.t0 = time.monotonic()
        self.trials: list[dict[str, Any]] = []

    def left_s(self) -> float:
        return self.budget_s - (time.monotonic() - self.t0)

    def run(self, knobs: dict[str, Any], timeout_s: float | None = None,
            round_: int | None = None) -> dict[str, Any]:
        """One trial; `round_` None for the reference baseline run before the rounds."""
        limit = min(self.left_s(), timeout_s) if timeout_s else self.left_s()
        _say(f"trial {len(self.trials) + 1}: {label(knobs)} (time limit {limit:.0f} s)")
        run_id = self.keeper.new_run() if self.keeper is not None else None
        keep = None if run_id is None else functools.partial(
            self.keeper.keep_trial, run_id=run_id, run_label=trial_run_label(self.keeper.tune_id, knobs, round_))
        t = run_trial(self.cmd, knobs, self.steps, self.warmup, limit, self.root, len(self.trials), run_id, keep)
        t["round"] = round_
        if t["error"] is not None:
            _say(f"trial {len(self.trials) + 1} {t['ended']}: {_error_line(t['error'])}")
        self.trials.append(t)
        return t


def _error_line(err: dict[str, Any]) -> str:
    rank = f"rank {err['rank']}: " if err.get("rank") is not None else ""
    tail = err.get("stderr_tail") or []
    return rank + (err.get("exception") or "") + (f" | {tail[-1]}" if tail else "")


def _rounds(search: Search, cands: list[dict], rounds: int, trial_s: float) -> list[dict[str, Any]]:
    """Run `rounds` rounds (baseline then candidates, reversed every other round) while the budget
    lasts; a candidate that failed is not run again. Returns the baselines of the rounds."""
    baselines, failed = [], set()
    for r in range(rounds):
        order = [None] + list(range(len(cands)))
        for i in (order if r % 2 == 0 else order[::-1]):
            if i in failed:
                continue
            if search.left_s() < trial_s:
                _say(f"budget spent: round {r + 1} left unfinished")
                return baselines
            t = search.run(cands[i]["knobs"] if i is not None else {}, TRIAL_TIME_FACTOR * trial_s, r)
            if i is None:
                baselines.append(t)
            else:
                cands[i].setdefault("runs", []).append(t)
                if t["error"] is not None:
                    failed.add(i)
    return baselines


def _run_row(t: dict[str, Any], base: dict[str, Any] | None) -> dict[str, Any]:
    m = t["measured"]
    return dict(round=t.get("round"), run_id=t.get("run_id"), step_time_s=m["step_time_s"], steps=m["steps"],
                wall_s=round(t["wall_s"], 3), baseline_step_time_s=base["measured"]["step_time_s"] if base else None,
                ended=t["ended"], error=t["error"])


def judge(cand: dict[str, Any], baselines: list[dict[str, Any]], ref: dict[str, Any], noise: float | None,
          tol: float, warmup: int) -> dict[str, Any]:
    """A candidate's record for the report (`--json`'s `trials` entries)."""
    from ddpviz.engine.tune import compare, loss_diff, same_math

    by_round = {b["round"]: b for b in baselines if usable(b, warmup)}
    runs = cand.get("runs", [])
    ok = [t for t in runs if usable(t, warmup)]
    pairs = [(by_round[t["round"]]["measured"]["step_time_s"], t["measured"]["step_time_s"])
             for t in ok if t["round"] in by_round]
    diffs = [d for t in ok for d in [loss_diff((by_round.get(t["round"]) or ref)["measured"]["losses"],
                                               t["measured"]["losses"])] if d is not None]
    diff = max(diffs) if diffs else None
    rejected, note = same_math("hook" if "comm_hook" in cand["knobs"] else "same", diff, tol, noise)
    errors = [t["error"] for t in runs if t["error"] is not None]
    if errors:
        rejected, note = True, f"the trial failed: {_error_line(errors[0])}"
    elif not runs:
        note = "not measured: the budget ran out first"
    times = sorted(t["measured"]["step_time_s"] for t in ok)
    return dict(knobs=cand["knobs"], why=cand["why"], step_time_s=times[len(times) // 2] if times else None,
                **compare(pairs), predicted_ratio=cand.get("predicted_ratio"),
                prediction_basis=cand.get("prediction_basis"), loss_max_abs_diff=diff, rejected=rejected,
                note=note, error=errors[0] if errors else None,
                runs=[_run_row(t, by_round.get(t["round"])) for t in runs])


def baseline_record(ref: dict[str, Any], baselines: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """The baseline's part of the report: the script's own settings, its step time over every
    baseline trial, and the loss difference between its runs (the script's own noise)."""
    from ddpviz.engine.tune import loss_diff, loss_tolerance, ready_curve

    m = ref["measured"]
    all_runs = [ref] + baselines
    ok = [t for t in all_runs if usable(t, warmup)]
    times = sorted(t["measured"]["step_time_s"] for t in ok)
    noises = [d for t in ok[1:] for d in [loss_diff(m["losses"], t["measured"]["losses"])] if d is not None]
    curve = ready_curve(m["buckets"])
    return dict(knobs={}, settings=m["ddp"]["settings"], has_buffers=m["ddp"]["has_buffers"],
                world_size=m["world_size"], step_time_s=times[len(times) // 2] if times else None,
                steps_recorded=m["steps"],  # fewer than asked where the script ends by itself first
                bucket_bytes=[round(c - p) for (c, _), p in zip(curve, [0.0] + [c for c, _ in curve[:-1]])],
                bucket_source="measured: median bytes per bucket index over the first baseline's steady steps",
                loss_noise=max(noises) if noises else None, loss_tolerance=loss_tolerance(m["losses"]),
                runs=[_run_row(t, None) for t in all_runs])


def tune(cmd: list[str], steps: int, warmup: int, budget_s: float, knobs: list[str], rounds: int,
         tries: list[dict[str, Any]] | None = None, keeper: TuneKeeper | None = None) -> dict[str, Any]:
    """The whole search (module docstring); returns the report (`--json`'s object). `tries`: the
    settings to try instead of the generated candidates (`--try`). `keeper`: stores each trial as
    a run before its spool goes (`workers.tunes`). Spools are made under a temporary folder and
    removed, whatever happens.

    Raises:
        TuneError: the baseline trial failed or measured nothing (the message says how it ended).
    """
    from ddpviz.engine.tune import TuneError, answer_line, asked, candidates, pick_best, plan, predict_ratio, \
        prediction_error

    root = Path(tempfile.mkdtemp(prefix="ddpviz-tune-"))
    try:
        search = Search(cmd, steps, warmup, budget_s, root, keeper)
        ref = search.run({})
        if ref["measured"]["ddp"] is None and not ref["error"]:  # it trained, but not through a DDP ddpviz saw
            raise TuneError(f"the baseline trial {ref['ended']}; {NO_DDP_TO_TUNE}")
        if not usable(ref, warmup) or ref["measured"]["ddp"] is None:
            raise TuneError(f"the baseline trial {ref['ended']}"
                            + (f" ({_error_line(ref['error'])})" if ref["error"] else
                               f"; it recorded {ref['measured']['steps']} step(s), tune needs > {warmup}"))
        ddp = ref["measured"]["ddp"]
        if tries:
            cands, skipped = [asked(ddp, t) for t in tries], []
        else:
            cands, skipped = candidates(ddp, knobs, no_sync=ref["measured"]["no_sync_micro_steps"] > 0)
        for c in cands:
            c["predicted_ratio"], c["prediction_basis"] = predict_ratio(ref["measured"], c)
        cands.sort(key=lambda c: (c["predicted_ratio"] is None, c["predicted_ratio"] or 0.0))
        n_rounds, keep = plan(search.left_s(), ref["wall_s"] * 1.1, len(cands), rounds)
        from ddpviz.workers.cli.tune_report import plan_text

        _say(plan_text(len(cands), n_rounds, keep))
        baselines = _rounds(search, cands[:keep], n_rounds, ref["wall_s"] * 1.1)
        base = baseline_record(ref, baselines, warmup)
        trials = [judge(c, baselines, ref, base["loss_noise"], base["loss_tolerance"], warmup) for c in cands]
        best = pick_best(trials)
        return dict(command=cmd, steps=steps, warmup=warmup, budget_s=budget_s,
                    elapsed_s=round(time.monotonic() - search.t0, 1), rounds=n_rounds, knobs=knobs,
                    baseline=base, trials=trials, skipped=skipped, best=best, answer=answer_line(best),
                    prediction_error=prediction_error(trials),
                    source="measured: whole trials of the command, each candidate against the same round's "
                           "baseline; predicted: engine.tune.predict_ratio (the scale-out step model)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def parse_try(text: str) -> dict[str, Any]:
    """"bucket_cap_mb=4,gradient_as_bucket_view=true" or "comm_hook=fp16" -> the knobs.

    Raises:
        ValueError: not KEY=VALUE pairs, a key tune does not set, a value of the wrong type (named).
    """
    from ddpviz.engine.attach.overrides import COMM_HOOKS, DDP_KWARGS_ENV, ddp_kwargs

    knobs: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, eq, value = part.partition("=")
        if not eq:
            raise ValueError(f"--try: {part!r} is not KEY=VALUE")
        v = value.strip()
        knobs[key.strip()] = {"true": True, "false": False}.get(v.lower(), v)
        if key.strip() == "bucket_cap_mb":
            try:
                knobs["bucket_cap_mb"] = float(v)
            except ValueError:
                raise ValueError(f"--try: bucket_cap_mb must be a number of MiB (got {v!r})") from None
    hook = knobs.pop("comm_hook", None)
    if hook is not None and hook not in COMM_HOOKS:
        raise ValueError(f"--try: comm_hook must be one of {', '.join(COMM_HOOKS)} (got {hook!r})")
    out = ddp_kwargs({DDP_KWARGS_ENV: json.dumps(knobs)}) if knobs else {}
    if not out and hook is None:
        raise ValueError(f"--try: no setting in {text!r}")
    return {**out, **({"comm_hook": hook} if hook else {})}


def open_keeper(url: str | None, cmd: list[str]) -> TuneKeeper:
    """Where the search keeps its trials and report: Redis at `url` (else `ddpviz run`'s choice,
    `workers.connection.redis_url`), or nothing, said once, when it does not answer (fail open)."""
    from ddpviz.workers.cli.upload import _store  # `ddpviz run`'s and `ddpviz upload`'s: fails fast, or None
    from ddpviz.workers.connection import redact, redis_url

    url = url or redis_url()
    store = _store(url)
    if store is None:
        _say(f"Redis at {redact(url)} does not answer: nothing of this search is stored (no runs, no report "
             f"for the app's Tune page); the answer is printed here only")
    return TuneKeeper(store, cmd, _say)


def cmd_tune(args: argparse.Namespace) -> int:
    from ddpviz.engine.tune import TuneError, parse_knobs

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    problems = [m for bad, m in (
        (not cmd, "give the command to tune after `--` (e.g. ddpviz tune -- torchrun --nproc-per-node 2 train.py)"),
        (args.steps < args.warmup + 3, f"--steps must be >= --warmup + 3 = {args.warmup + 3} (got {args.steps})"),
        (args.warmup < 2, f"--warmup must be >= 2: DDP rebuilds its buckets after step 0 (got {args.warmup})"),
        (not args.budget > 0, f"--budget must be > 0 seconds (got {args.budget})"),
        (args.rounds < 1, f"--rounds must be >= 1 (got {args.rounds})")) if bad]
    try:
        knobs = parse_knobs(args.knobs)
        tries = [parse_try(t) for t in args.try_ or []]
    except ValueError as exc:
        problems.append(str(exc).replace("DDPVIZ_TUNE_DDP_KWARGS", "--try"))
    if problems:
        for p in problems:
            _say(f"refused: {p}")
        return EXIT_REFUSED
    keeper = open_keeper(args.url, cmd)
    try:
        rep = tune(cmd, args.steps, args.warmup, args.budget, knobs, args.rounds, tries, keeper)
    except TuneError as exc:
        _say(str(exc))
        return EXIT_FAILED
    if keeper.keep_report(rep):
        _say(f"stored as tune {rep['tune_id']}: its trials are runs, its report on the app's Tune page")
    if args.json:
        print(json.dumps(rep, indent=2, default=str))
    else:
        from ddpviz.workers.cli.tune_report import print_report

        print_report(rep)
    return EXIT_OK


def register(command) -> None:
    """Add `tune` to the ddpviz parser (`command` as in `workers.cli.commands.build_parser`)."""
    p = command("tune", cmd_tune, "find DDP settings that make a training command faster: short trials "
                                  "taking turns against its own settings, predicted and measured; stored for the app's "
                                  "Tune page when Redis answers")
    p.add_argument("--steps", type=int, default=30, help="optimizer steps per trial (default 30)")
    p.add_argument("--warmup", type=int, default=5,
                   help="first steps of each trial left out of its step time (default 5)")
    p.add_argument("--budget", type=float, default=300.0, metavar="SECONDS",
                   help="time for the whole search, every trial included (default 300)")
    p.add_argument("--knobs", default=None, metavar="K,K,...",
                   help="knobs to try: bucket_cap_mb, gradient_as_bucket_view, static_graph, broadcast_buffers "
                        "(the default: all four), fp16, bf16, powersgd (comm hooks: they change the numbers)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of trials taking turns (default 3; fewer if "
                                                         "the budget is short)")
    p.add_argument("--try", dest="try_", action="append", metavar="K=V,...",
                   help="try this setting instead of the generated candidates (repeatable), e.g. "
                        "--try bucket_cap_mb=4 to confirm an earlier answer")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the training command")
