"""`ddpviz tune`'s reasoning, apart from running anything: which settings to try, what the step
model predicts for each, what the trials measured, and the verdict. Pure Python (no torch, no
numpy); `workers.cli.tune` runs the trials and feeds this module their events.

A trial is one run of the user's command for N optimizer steps under DDP arguments given by tune
(`engine.attach.overrides`). `measure_trial` reads its events: the step time of each steady step
(the steps from `warmup` on; the slowest rank's `step_time_s`, since the ranks wait for each other
in the all-reduce), each rank's loss of each step, the steady steps' buckets and the DDP's record
(`tune: "ddp"` log event).

Candidates (`candidates`) come from the baseline's measured layout: bucket caps that give one
bucket, half and double the script's cap, about 4 and about 8 buckets (a cap whose layout equals
another's is tried once); `gradient_as_bucket_view=True` and `static_graph=True` where the script
has them off; `broadcast_buffers=False` only where the model has buffers (without buffers DDP
broadcasts nothing, so there is nothing to gain); comm hooks only when asked for.

Prediction (`predict_ratio`): the scale-out predictor's DDP step model (`engine.predict.step_models`)
run on the baseline's own buckets and on the candidate's layout, with this run's link fitted to the
baseline's bucket all-reduces (`engine.predict.inputs.fit_link`) and each bucket's ready time read
off the baseline's ready times at the same cumulative gradient bytes (linear between them): the
prediction is the baseline's measured step time plus the change in modelled exposed
communication. Knobs the model has no term for are predicted unchanged (ratio 1), and say so.

Measurement (`compare`): rounds of whole trials taking turns (ABAB...); per round the candidate's
step time over the baseline's of the same round; the ratio is the median over rounds and its 90%
interval the bootstrap over rounds (`engine.measure.bootstrap.median_interval`). "faster" only when
the whole interval is below 1, "slower" above, else "level".
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Any, Iterable, Sequence

from ddpviz.engine.measure.bootstrap import median_interval
from ddpviz.engine.predict.inputs import fit_link
from ddpviz.engine.predict.step_models import ddp_step, ring_allreduce_s

MIB = 2**20  # DDP's bucket_cap_mb is in MiB (torch: _MB_TO_BYTES = 1024 * 1024)
SAME_MATH = ("bucket_cap_mb", "gradient_as_bucket_view", "static_graph", "broadcast_buffers")
COMM_HOOKS = ("fp16", "bf16", "powersgd")
KNOBS = SAME_MATH + COMM_HOOKS
LEVEL = 0.90
# A bootstrap over R rounds of the median gives [min, max] of the round ratios for R <= 5, so
# "faster" means every round was faster; a candidate no different from the baseline does that by
# chance with probability 2^-R: 25% for 2 rounds, 12.5% for 3. Below MIN_ROUNDS no verdict.
MIN_ROUNDS = 3
LOSS_STEPS = 10  # losses compared over the first steps (before float reordering can compound)
LOSS_RTOL = 1e-5  # same math: |loss - baseline's| <= LOSS_RTOL * max(1, |loss|) (float reordering)
HOOK_LINES = {
    "fp16": "ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)",
    "bf16": "ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)",
    "powersgd": "ddp.register_comm_hook(powerSGD_hook.PowerSGDState(process_group=None, "
                "matrix_approximation_rank=1, start_powerSGD_iter=2), powerSGD_hook.powerSGD_hook)",
}
HOOK_IMPORT = "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook"


class TuneError(ValueError):
    """Bad input to tune (the message names the field and the rule)."""


def parse_knobs(text: str | None) -> list[str]:
    """"bucket_cap_mb,fp16" -> ["bucket_cap_mb", "fp16"]; None or "" -> the same-math knobs.

    Raises:
        TuneError: a name outside `KNOBS`.
    """
    names = [t.strip() for t in (text or "").split(",") if t.strip()] or list(SAME_MATH)
    bad = [n for n in names if n not in KNOBS]
    if bad:
        raise TuneError(f"--knobs: {', '.join(bad)} not known (choose from {', '.join(KNOBS)})")
    return list(dict.fromkeys(names))


# -- bucket layouts -----------------------------------------------------------------------------

def layout_bytes(param_nbytes: Sequence[int], cap_bytes: int, first_cap_bytes: int | None = None) -> list[int]:
    """Bytes of each bucket when parameters of `param_nbytes` (in the order their gradients become
    ready) are packed as DDP's reducer packs them: a bucket closes once it holds >= its cap, the
    first bucket's cap `first_cap_bytes` (default `cap_bytes`), every later one's `cap_bytes`
    (torch: `_compute_bucket_assignment_by_size`, `Reducer::rebuild_buckets`; one dtype and device).

    Raises:
        TuneError: a cap <= 0.
    """
    first = cap_bytes if first_cap_bytes is None else first_cap_bytes
    if cap_bytes <= 0 or first <= 0:
        raise TuneError(f"bucket cap must be > 0 bytes (got {cap_bytes}, first {first})")
    out, size = [], 0
    for nbytes in param_nbytes:
        size += nbytes
        if size >= (first if not out else cap_bytes):
            out.append(size)
            size = 0
    if size:
        out.append(size)
    return out


def ready_order(param_nbytes: Sequence[int]) -> list[int]:
    """Parameters in the order their gradients become ready, taken as the reverse of
    `module.parameters()` (backward runs the layers last to first; DDP's rebuild orders buckets
    by the measured ready order, which this approximates)."""
    return list(reversed(param_nbytes))


def _nice_mb(x_mb: float) -> float:
    """x rounded up to 2 significant figures (caps people can paste)."""
    if x_mb <= 0:
        raise TuneError(f"bucket_cap_mb must be > 0 (got {x_mb})")
    digits = 1 - int(math.floor(math.log10(x_mb)))
    step = 10.0 ** -digits
    return round(math.ceil(x_mb / step - 1e-9) * step, max(0, digits))


def cap_candidates(param_nbytes: Sequence[int], script_cap_bytes: int, first_bucket_bytes: int) -> list[dict]:
    """Bucket caps around the measured layout (module docstring), each with its layout's bytes;
    none whose layout equals the script's or an earlier candidate's."""
    order = ready_order(param_nbytes)
    total = sum(order)
    script = layout_bytes(order, script_cap_bytes, first_bucket_bytes)
    wanted = [("one bucket", total * 1.0), ("half the script's cap", script_cap_bytes / 2),
              ("double the script's cap", script_cap_bytes * 2.0), ("about 4 buckets", total / 4),
              ("about 8 buckets", total / 8)]
    seen, out = [script], []
    for why, cap in wanted:
        if cap < 1024:  # below 1 KiB a cap only adds per-bucket latency
            continue
        mb = _nice_mb(cap / MIB)
        layout = layout_bytes(order, int(mb * MIB))
        if layout in seen:
            continue
        seen.append(layout)
        out.append(dict(knobs={"bucket_cap_mb": mb}, why=why, layout_bytes=layout))
    return out


def candidates(ddp: dict[str, Any], knobs: Iterable[str], no_sync: bool = False) -> tuple[list[dict], list[str]]:
    """The settings to try against the baseline, and why each knob left out was left out.

    Args:
        ddp: the baseline's DDP record (`tune: "ddp"` log event: settings, param_nbytes, has_buffers, backend).
        knobs: names from `KNOBS` (`parse_knobs`).
        no_sync: the baseline accumulated gradients under `no_sync()`: static_graph=True is left
            out (it asserts in DDP's reducer, or once past that stops all-reducing:
            pytorch/pytorch#143580, #187732).

    Returns:
        (candidates, skipped): candidates as ``{knobs, why, layout_bytes?}``; skipped as sentences.
    """
    knobs, s = list(knobs), ddp["settings"]
    out, skipped = [], []
    if "bucket_cap_mb" in knobs:
        out += cap_candidates(ddp["param_nbytes"], int(ddp["bucket_bytes_cap"]), int(s["first_bucket_bytes"]))
    for name in ("gradient_as_bucket_view", "static_graph"):
        if name in knobs and s.get(name):
            skipped.append(f"{name}: the script already sets it")
        elif name == "static_graph" and name in knobs and no_sync:
            skipped.append("static_graph: the script accumulates under no_sync(), which static_graph=True "
                           "does not support (pytorch/pytorch#143580)")
        elif name in knobs:
            out.append(dict(knobs={name: True}, why="saves a gradient copy" if name.startswith("grad")
                            else "DDP may skip per-step graph checks"))
    if "broadcast_buffers" in knobs:
        if not ddp.get("has_buffers"):
            skipped.append("broadcast_buffers: the model has no buffers, so DDP broadcasts none already")
        elif not s.get("broadcast_buffers"):
            skipped.append("broadcast_buffers: the script already turns it off")
        else:
            out.append(dict(knobs={"broadcast_buffers": False}, why="no buffer broadcast before each forward"))
    for h in (h for h in COMM_HOOKS if h in knobs):
        if h == "powersgd" and ddp.get("backend") == "gloo":
            n = len(layout_bytes(list(reversed(ddp["param_nbytes"])), int(ddp["bucket_bytes_cap"]),
                                 int(s["first_bucket_bytes"])))
            if n > 1:  # engine.modes.ddp.comm_hooks: PyTorch's hook waits inside gloo's callback threads
                skipped.append(f"powersgd: the script's gradients are in {n} buckets on gloo, where PyTorch's "
                               f"powerSGD_hook hangs the run at its first compressed step (its callbacks wait for "
                               f"the next all-reduce on gloo's worker threads)")
                continue
        out.append(dict(knobs={"comm_hook": h}, why="compresses the all-reduce (changes the numbers)"))
    return out, skipped


# -- what one trial measured --------------------------------------------------------------------

def measure_trial(events: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """One trial's numbers from its events (every rank's).

    Returns:
        ``{steps, step_time_s, steady_steps, backward_s, losses, buckets, ddp, stopped, world_size,
        no_sync_micro_steps}`` (the last: summed over ranks and steps):
        `steps` the steps every rank recorded; `step_time_s` the median over steady steps (index >=
        `warmup`) of the slowest rank's `step_time_s` (None without steady steps); `backward_s` the
        median of every rank's steady `backward_s` (backward less exposed comm); `losses`
        {rank: [loss of step 0, 1, ...]}; `buckets` the steady steps' bucket events of DDP 0;
        `ddp` rank 0's DDP record (None if no DDP was built); `stopped` rank 0's stop record.
    """
    by_step: dict[int, dict[int, float]] = defaultdict(dict)
    backward: list[float] = []
    losses: dict[int, dict[int, float]] = defaultdict(dict)
    ddp = stopped = None
    buckets, no_sync = [], 0
    for e in events:
        rank, kind = int(e.get("rank") or 0), e.get("type")
        if kind == "step" and e.get("step_time_s") is not None:
            no_sync += int(e.get("no_sync_micro_steps") or 0)
            by_step[e["step"]][rank] = float(e["step_time_s"])
            if e["step"] >= warmup and e.get("backward_s") is not None:
                backward.append(float(e["backward_s"]))
            if e.get("loss") is not None:
                losses[rank][e["step"]] = float(e["loss"])
        elif kind == "bucket" and e.get("step", -1) >= warmup and (e.get("ddp_index") or 0) == 0:
            buckets.append(e)
        elif kind == "log" and e.get("tune") == "ddp" and rank == 0 and ddp is None:
            ddp = e
        elif kind == "log" and e.get("tune") == "stop" and rank == 0:
            stopped = e
    world = max((len(r) for r in by_step.values()), default=0)
    steps = sorted(s for s, r in by_step.items() if len(r) == world)
    steady = [max(by_step[s].values()) for s in steps if s >= warmup]
    return dict(steps=len(steps), step_time_s=statistics.median(steady) if steady else None, steady_steps=steady,
                backward_s=statistics.median(backward) if backward else None,
                losses={r: [v[s] for s in sorted(v)] for r, v in sorted(losses.items())}, buckets=buckets,
                ddp=ddp, stopped=stopped, world_size=world, no_sync_micro_steps=no_sync)


def loss_diff(base: dict[int, list[float]], other: dict[int, list[float]], steps: int = LOSS_STEPS) -> float | None:
    """Largest |loss - baseline's loss| over every rank and the first `steps` steps both recorded
    (None when they share no step)."""
    diffs = [abs(a - b) for r in base if r in other for a, b in zip(base[r][:steps], other[r][:steps])]
    return max(diffs) if diffs else None


def loss_tolerance(base: dict[int, list[float]], steps: int = LOSS_STEPS) -> float:
    """`LOSS_RTOL` x max(1, the largest |loss| of the baseline's first steps)."""
    return LOSS_RTOL * max([1.0] + [abs(v) for vs in base.values() for v in vs[:steps]])


def same_math(kind: str, diff: float | None, tol: float, noise: float | None) -> tuple[bool, str]:
    """Whether a trial whose losses differ from the baseline's by `diff` is rejected, and why.

    `kind` "same" (a knob that must not change the mathematics) or "hook" (compression: the
    difference is shown, never a reason to reject). `noise`: the loss difference between two
    baseline runs; above `tol` the script is not deterministic and no check is possible.
    Returns (rejected, note)."""
    if diff is None:
        return False, "no loss to compare (the script's backward() was not called on a scalar)"
    if kind == "hook":
        return False, f"changes the numbers: losses differ from the baseline's by up to {diff:.3g}"
    if noise is not None and noise > tol:
        return False, (f"not checked: two baseline runs' losses differ by {noise:.3g} (> {tol:.3g}); "
                       "the script is not deterministic")
    if diff > tol:
        return True, f"rejected: losses differ from the baseline's by {diff:.3g} (> {tol:.3g}, float reordering)"
    return False, f"same math: losses within {tol:.3g} of the baseline's (largest difference {diff:.3g})"


# -- predict --------------------------------------------------------------------------------------

def ready_curve(buckets: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """[(cumulative bytes, ready_s)] at the end of each bucket in launch order: per bucket index
    the median bytes and median ready time over the steady steps and ranks (null ready: not timed)."""
    by: dict[int, list[dict]] = defaultdict(list)
    for b in buckets:
        if b.get("ready_s") is not None:
            by[int(b["bucket_index"])].append(b)
    out, total = [], 0.0
    for i in sorted(by):
        total += statistics.median(b["nbytes"] for b in by[i])
        out.append((total, statistics.median(b["ready_s"] for b in by[i])))
    return out


def ready_at(curve: Sequence[tuple[float, float]], nbytes: float) -> float:
    """Ready time (s) at cumulative gradient bytes `nbytes`, linear between (0, 0) and the
    curve's points; the last point's time beyond it."""
    x0, y0 = 0.0, 0.0
    for x1, y1 in curve:
        if nbytes <= x1:
            return y0 + (y1 - y0) * (nbytes - x0) / (x1 - x0) if x1 > x0 else y1
        x0, y0 = x1, y1
    return y0


def modelled_exposed_s(layout: Sequence[float], curve: Sequence[tuple[float, float]], backward_s: float,
                       link: dict[str, float], world_size: int, wire: float = 1.0) -> float:
    """Exposed all-reduce time (s) of buckets of `layout` gradient bytes (launch order) in the step
    model (`step_models.ddp_step`, ring all-reduce with the link's alpha/beta), each sending
    `wire` x its bytes (0.5 for a 16-bit compression hook; ready times stay the gradients')."""
    cums, total = [], 0.0
    for b in layout:
        total += b
        cums.append(total)
    ready = [min(ready_at(curve, c), backward_s) / backward_s for c in cums]
    comm = lambda nb: ring_allreduce_s(nb * wire, world_size, link["alpha_s"], link["beta_bytes_per_s"])  # noqa: E731
    return ddp_step(forward_s=0.0, backward_s=backward_s, optimizer_s=0.0, other_s=0.0,
                    buckets=list(enumerate(layout)), ready_frac=ready, n=world_size, comm=comm)["comm_exposed_s"]


def predict_ratio(base: dict[str, Any], cand: dict[str, Any]) -> tuple[float | None, str]:
    """Predicted candidate/baseline step time ratio, and its basis in words.

    `base`: `measure_trial` of a baseline; `cand`: a candidate (`candidates`). Bucket caps and the
    fp16/bf16 hooks (half the bytes, same layout) are modelled; other knobs are predicted
    unchanged (1.0); None when the baseline has no timed buckets or no link fits them."""
    knobs = cand["knobs"]
    hook = knobs.get("comm_hook")
    if "bucket_cap_mb" not in knobs and hook not in ("fp16", "bf16"):
        if hook:
            return None, f"the step model has no term for the {hook} hook"
        return 1.0, f"the step model has no term for {', '.join(knobs)}: predicted unchanged"
    curve, n, bwd = ready_curve(base["buckets"]), base["world_size"], base.get("backward_s")
    link = fit_link(None, base["buckets"], n) if curve else None
    if not curve or link is None or not bwd or not base.get("step_time_s"):
        return None, "no timed buckets in the baseline's steady steps: nothing to predict from"
    base_layout = [c - p for (c, _), p in zip(curve, [0.0] + [c for c, _ in curve[:-1]])]
    layout = cand.get("layout_bytes") or base_layout
    wire = 0.5 if hook else 1.0  # 16-bit floats on the wire: half of float32's bytes
    delta = modelled_exposed_s(layout, curve, bwd, link, n, wire) - modelled_exposed_s(base_layout, curve, bwd, link, n)
    return (base["step_time_s"] + delta) / base["step_time_s"], (
        f"step model: the baseline's measured step + the change in modelled exposed all-reduce "
        f"({delta * 1e3:+.3f} ms; {len(layout)} bucket(s); link {link['source']})")


# -- measure, judge, answer -----------------------------------------------------------------------

def compare(pairs: Sequence[tuple[float, float]], level: float = LEVEL) -> dict[str, Any]:
    """Candidate against baseline over rounds.

    Args:
        pairs: ``(baseline_step_time_s, candidate_step_time_s)`` of each round (same round: taken
            in turns, so drift between rounds cancels in the ratio).

    Returns:
        ``{ratio, interval, verdict, rounds}``: ratio the median of candidate/baseline over rounds;
        interval the `level` bootstrap interval over rounds (None with one round); verdict
        "faster" (interval below 1), "slower" (above 1), "level" (holds 1), "too few rounds"
        (fewer than `MIN_ROUNDS`: no verdict) or "not measured".

    Raises:
        TuneError: a step time <= 0.
    """
    if any(not (b > 0 and c > 0) for b, c in pairs):
        raise TuneError(f"step times must be > 0 (got {list(pairs)})")
    ratios = [c / b for b, c in pairs]
    if not ratios:
        return dict(ratio=None, interval=None, verdict="not measured", rounds=0)
    ratio = statistics.median(ratios)
    if len(ratios) < 2:
        return dict(ratio=ratio, interval=None, verdict="too few rounds", rounds=1)
    lo, hi = median_interval(ratios, level)
    verdict = "faster" if hi < 1 else "slower" if lo > 1 else "level"
    if len(ratios) < MIN_ROUNDS:
        verdict = "too few rounds"
    return dict(ratio=ratio, interval=[lo, hi], verdict=verdict, rounds=len(ratios))


def paste_lines(knobs: dict[str, Any]) -> list[str]:
    """What to put in the script for `knobs`: the DDP constructor's arguments, or a comm hook's
    registration (with its import)."""
    hook = knobs.get("comm_hook")
    if hook:
        return [HOOK_IMPORT, HOOK_LINES[hook]]
    args = ", ".join(f"{k}={v!r}" for k, v in knobs.items())
    return [f"DistributedDataParallel(model, ..., {args})"]


def pick_best(trials: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The trial with the smallest ratio among those not rejected whose interval is below 1
    (verdict "faster"); None when there is none."""
    ok = [t for t in trials if not t.get("rejected") and t.get("verdict") == "faster"]
    if not ok:
        return None
    t = min(ok, key=lambda t: t["ratio"])
    return dict(knobs=t["knobs"], ratio=t["ratio"], interval=t["interval"], gain=1 - t["ratio"],
                paste=paste_lines(t["knobs"]))


def prediction_error(trials: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Predictor error on this script: predicted_ratio / measured ratio - 1 over the trials that
    have both, as ``{median_abs, worst, count}`` (worst: the largest in size, with its sign)."""
    errs = [t["predicted_ratio"] / t["ratio"] - 1 for t in trials
            if t.get("predicted_ratio") is not None and t.get("ratio")]
    if not errs:
        return dict(median_abs=None, worst=None, count=0)
    return dict(median_abs=statistics.median(abs(e) for e in errs), worst=max(errs, key=abs), count=len(errs))


def answer_line(best: dict[str, Any] | None) -> str:
    """One sentence: the best setting with its gain and interval, or that none beat the baseline."""
    if best is None:
        return "none beat the baseline beyond noise (no candidate's 90% interval of the ratio is below 1)"
    lo, hi = best["interval"]
    knobs = ", ".join(f"{k}={v}" for k, v in best["knobs"].items())
    return (f"best: {knobs}: step time x{best['ratio']:.3f} of the baseline's (90% interval "
            f"{lo:.3f}-{hi:.3f}), {best['gain']:.1%} faster")


def plan(left_s: float, trial_s: float, n_candidates: int, rounds: int) -> tuple[int, int]:
    """(rounds, candidates kept) that fit `left_s` seconds of trials lasting `trial_s` each: a
    round is the baseline and every candidate kept; candidates are dropped from the end until
    `MIN_ROUNDS` rounds fit (or `rounds`, if fewer), or one candidate is left.

    Raises:
        TuneError: trial_s <= 0 or rounds < 1.
    """
    if not trial_s > 0 or rounds < 1:
        raise TuneError(f"trial_s must be > 0 and rounds >= 1 (got {trial_s}, {rounds})")
    fit = int(left_s // trial_s)
    keep = n_candidates
    while keep > 1 and fit // (keep + 1) < min(MIN_ROUNDS, rounds):
        keep -= 1
    return min(rounds, fit // (keep + 1)) if keep else 0, keep


def asked(ddp: dict[str, Any], knobs: dict[str, Any]) -> dict[str, Any]:
    """A candidate the user named (`ddpviz tune --try`), with its layout when it sets a cap."""
    out = dict(knobs=dict(knobs), why="asked for (--try)")
    if "bucket_cap_mb" in knobs:
        out["layout_bytes"] = layout_bytes(ready_order(ddp["param_nbytes"]), int(knobs["bucket_cap_mb"] * MIB))
    return out
