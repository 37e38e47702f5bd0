"""`ddpviz doctor --gpu`: the CUDA paths, each check with a verdict and its figures.

Runs after the CPU checks, with the doctor's private Redis and worker still up, in this order:
the `gpu`-marked tests; single, DP (torch.nn.parallel, device_ids=[0..]) and DDP (NCCL) on a GPT
of ~100 M parameters, 10 SGD steps, with `compare`'s parity against single; memory readings per
second per device in those runs (the bench's count); NVML, directly and through ddpviz's own
reader, against `torch.cuda.memory_reserved` for the same GPU (by UUID); bf16 autocast inside DP
replica threads; DDP with 2 ranks sharing cuda:0 over gloo (CUDA-event buckets and
memory per rank); the overhead of instrumented vs plain DDP; an attached DDP on NCCL adds no
synchronisation to the script's steps (`engine.harness.attach_sync`); with 2+ GPUs the DP/DDP pair at
world_size = GPU count and device 0's memory hot spot; a DP and a DDP run on the GPU through the
queue; screenshots of Live and Bucket timeline of those runs. Sized for <= 8 minutes on one GPU.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Callable

from ddpviz.workers.doctor.report import CheckFailed, CheckSkipped, Report, run_check

ROOT = Path(__file__).resolve().parents[2]
GPT_100M = dict(model="gpt", dataset="text", width=768, depth=14, n_head=12, block_size=256)  # 99.5 M params
PARITY = dict(GPT_100M, world_size=1, global_batch_size=8, steps=10, lr=0.01, device="cuda", eval_every=0,
              step_delay_s=0.0)
SMALL_GPT = dict(model="gpt", dataset="text", width=256, depth=4, n_head=4, block_size=128, global_batch_size=16,
                 device="cuda", eval_every=0, step_delay_s=0.0)
# SGD, not the default AdamW: fp32 attention backward may use atomics (run-to-run noise ~1e-10),
# and AdamW's m / sqrt(v) turns noise that small into steps of ~lr = 1e-2..1e-4; SGD moves each
# parameter by lr x its gradient, so the noise stays ~1e-12.
PARITY_OPTIMIZER = "sgd"
PARITY_MAX_DIFF = 1e-4  # largest |parameter difference| vs single after PARITY's steps (fp32, SGD)
MEMORY_SAMPLES_PER_S_TARGET = 10.0  # per device, the measured-memory issue's target
OVERHEAD_RATIO_TARGET = 1.03  # instrumented / plain median step time, the measured-memory issue's target
GPU_TESTS_TIMEOUT_S = 240


def run_gpu_checks(stack, report: Report, out_dir: Path, log: Callable[[str], None]) -> None:
    """Add every GPU check to `report` (see module docstring)."""
    state: dict[str, Any] = {}
    for name, fn in (("cuda", check_cuda), ("gpu_tests", check_gpu_tests),
                     ("parity_gpt_100m", lambda: check_parity(state)),
                     ("memory_samples_per_s", lambda: check_memory_rate(state)),
                     ("nvml_vs_allocator", check_nvml), ("bf16_in_dp_replicas", check_amp),
                     ("ddp_2_ranks_one_gpu_gloo", check_shared_gpu), ("overhead_ddp_gpu", check_overhead),
                     ("attach_adds_no_sync", check_attach_sync),
                     ("launched_adds_no_sync", check_launched_sync),
                     ("multi_gpu_pair", check_multi_gpu),
                     ("gpu_runs_through_queue", lambda: check_queue_runs(stack, state)),
                     ("screenshots", lambda: check_screenshots(stack, state, out_dir))):
        report.add(run_check(name, fn, log))


def check_cuda() -> tuple[str, dict[str, Any]]:
    from ddpviz.engine.harness.gpu_checks import cuda_inventory

    from ddpviz.workers.doctor.versions import describe, mismatch, read_versions

    inv = cuda_inventory()
    versions = read_versions()
    inv.update(driver=versions["driver"], driver_cuda=versions["driver_cuda"], version_note=mismatch(versions))
    names = ", ".join(d["name"] for d in inv["devices"])
    return f"{inv['device_count']} GPU(s): {names}; {describe(versions)}", inv


def gpu_test_files() -> list[Path]:
    """Test files that carry the `gpu` mark (collected alone, so the others' extras are not needed)."""
    tests = ROOT / "tests"
    return sorted(p for p in tests.rglob("test_*.py") if "mark.gpu" in p.read_text(errors="replace"))


def check_gpu_tests() -> tuple[str, dict[str, Any]]:
    files = gpu_test_files()
    if not files:
        raise CheckSkipped(f"no gpu-marked tests under {ROOT / 'tests'} (not a source checkout)")
    with tempfile.TemporaryDirectory(prefix="ddpviz-doctor-tests-") as tmp:
        xml = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
               f"--junitxml={xml}", *map(str, files)]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=GPU_TESTS_TIMEOUT_S)
        if not xml.exists():
            raise CheckFailed(f"pytest exited {proc.returncode} without a report", dict(tail=proc.stdout[-3000:]))
        suite = ET.parse(xml).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        cases = suite.findall("testcase")
    failed = [c.get("name") for c in cases if c.find("failure") is not None or c.find("error") is not None]
    skipped = [c.get("name") for c in cases if c.find("skipped") is not None]
    figures = dict(files=[str(f.relative_to(ROOT)) for f in files], tests=len(cases), failed=failed,
                   skipped=skipped, passed=len(cases) - len(failed) - len(skipped), pytest_exit=proc.returncode)
    if failed or not cases or len(skipped) == len(cases):
        raise CheckFailed(f"{len(failed)} of {len(cases)} gpu tests failed, {len(skipped)} skipped",
                          dict(figures, tail=proc.stdout[-3000:]))
    return f"{figures['passed']} gpu tests passed", figures


def check_parity(state: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    from ddpviz.engine.config import RunConfig
    from ddpviz.engine.events import ListSink
    from ddpviz.engine.harness.compare import compare

    sinks = {m: ListSink() for m in ("single", "dp", "ddp")}
    result = compare(RunConfig(mode="ddp", **{**PARITY, "optimizer": PARITY_OPTIMIZER}), sink_for=lambda m: sinks[m])
    state["parity_events"] = {m: s.events for m, s in sinks.items()}
    started = next(e for e in sinks["single"].events if e["type"] == "run_started")
    figures = dict(config=started.get("config"), param_count=started.get("param_count"), modes=result)
    bad = [f"{m} {r['status']}: {(r['error'] or {}).get('exception')}" for m, r in result.items()
           if r["status"] != "succeeded"]
    if bad:
        raise CheckFailed("; ".join(bad), figures)
    diffs = {m: result[m]["max_param_diff_vs_single"] for m in ("dp", "ddp")}
    far = {m: d for m, d in diffs.items() if d is None or d > PARITY_MAX_DIFF}
    if far:
        raise CheckFailed(f"parameters differ from single by {far} (bound {PARITY_MAX_DIFF:g})", figures)
    opt = (started.get("config") or {}).get("optimizer")
    return (f"{started.get('param_count'):,} parameters, {PARITY['steps']} steps of {opt}; max |Δθ| vs single: "
            f"DP {diffs['dp']:.2e}, DDP {diffs['ddp']:.2e}", figures)


def check_memory_rate(state: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Memory readings that reached the run's events, per second of training, per device: the
    same count as `ddpviz bench`'s figure 5 (`workers.bench.measured.memory_samples_per_s`)."""
    from ddpviz.workers.bench.measured import memory_samples_per_s

    if "parity_events" not in state:
        raise CheckSkipped("needs the parity runs' events")
    rates = {m: memory_samples_per_s(ev) for m, ev in state["parity_events"].items()}
    lowest = min((r["min_per_s"] or 0.0 for r in rates.values()), default=0.0)
    figures = dict(per_mode_device=rates, target_per_s=MEMORY_SAMPLES_PER_S_TARGET, lowest_per_s=lowest)
    if lowest < MEMORY_SAMPLES_PER_S_TARGET:
        raise CheckFailed(f"lowest rate {lowest:.1f} samples/s per device, below the target "
                          f"{MEMORY_SAMPLES_PER_S_TARGET:g}", figures)
    return f"at least {lowest:.1f} memory samples/s on every device", figures


def check_nvml() -> tuple[str, dict[str, Any]]:
    from ddpviz.engine.harness.gpu_checks import nvml_vs_allocator

    try:
        fig = nvml_vs_allocator(0)
    except RuntimeError as exc:
        raise CheckFailed(str(exc)) from None
    # What ddpviz's own memory events carry for cuda:0 (their `used_bytes`): its reader, not a copy
    # of it. A reader that is gone or reads nothing where NVML answers fails the check.
    from ddpviz.engine.measure import memory

    reader = getattr(memory, "NvmlReader", None)
    if reader is None:
        raise CheckFailed("ddpviz.engine.measure.memory.NvmlReader is missing: memory events would carry no NVML figure", fig)
    fig["engine_nvml_used_bytes"] = reader().used_bytes(0)
    if fig["engine_nvml_used_bytes"] is None:
        raise CheckFailed("ddpviz's NVML reader (engine.measure.memory.NvmlReader) read nothing for cuda:0 "
                          "where NVML answered: memory events would carry used_bytes null", fig)
    low = {k: fig[k] for k in ("nvml_used_bytes", "engine_nvml_used_bytes") if fig[k] < fig["torch_reserved_bytes"]}
    if low:
        raise CheckFailed(f"NVML reports less memory used than this process has reserved ({', '.join(low)}): "
                          f"wrong GPU?", fig)
    return (f"NVML {fig['nvml_used_bytes'] / 2**20:.0f} MiB used, torch reserved "
            f"{fig['torch_reserved_bytes'] / 2**20:.0f} MiB; difference {fig['difference_bytes'] / 2**20:.0f} MiB", fig)


def check_amp() -> tuple[str, dict[str, Any]]:
    from ddpviz.engine.harness.gpu_checks import amp_in_replicas

    fig = amp_in_replicas()
    ours = {k: v for k, v in fig.items() if k.startswith("ddpviz")}
    wrong = {k: v for k, v in ours.items() if v != [fig["asked"]]}
    if wrong:
        raise CheckFailed(f"replica ops ran in {wrong}, not {fig['asked']}", fig)
    return (f"every ddpviz replica ran {fig['asked']}; torch's parallel_apply threads ran "
            f"{fig['torch_parallel_apply_two_threads_on_cuda0']}", fig)


def check_shared_gpu() -> tuple[str, dict[str, Any]]:
    from ddpviz.engine.harness.gpu_checks import shared_gpu_ddp

    fig = shared_gpu_ddp(world=2, steps=4)
    errors = [r["error"] for r in fig["ranks"] if "error" in r]
    if fig.get("error") or not fig["ranks"]:
        raise CheckFailed(f"a rank died: {fig.get('error')}", fig)
    if errors and all(e["stage"] == "init" for e in errors):
        raise CheckSkipped(f"torch does not allow 2 gloo ranks with CUDA tensors on one GPU here: "
                           f"{errors[0]['exception']}")
    if errors:
        raise CheckFailed(f"ranks failed while training: {errors}", fig)
    summary = []
    for r in fig["ranks"]:
        last = r["steps"][-1]
        ok = all(b["comm_start_s"] is not None and 0 <= b["ready_s"] <= b["comm_start_s"] <= b["comm_end_s"]
                 for s in r["steps"] for b in s["buckets"])
        summary.append(dict(rank=r["rank"], buckets_last_step=len(last["buckets"]), times_ordered=ok,
                            allocated_bytes=last["memory"]["allocated_bytes"],
                            reserved_bytes=last["memory"]["reserved_bytes"]))
    fig["summary"] = summary
    in_sync = all(c == fig["ranks"][0]["checksums"][0] for c in fig["ranks"][0]["checksums"])
    if not all(s["times_ordered"] and s["buckets_last_step"] >= 2 and s["allocated_bytes"] > 0 for s in summary) \
            or not in_sync:
        raise CheckFailed("bucket times out of order, too few buckets, no memory, or replicas out of sync", fig)
    return f"2 ranks on cuda:0 over gloo: {summary[0]['buckets_last_step']} CUDA-timed buckets per step, in sync", fig


def check_attach_sync() -> tuple[str, dict[str, Any]]:
    from ddpviz.engine.harness.attach_sync import attach_sync_probe, attach_sync_verdict

    fig = dict(plain=attach_sync_probe("cuda", instrumented=False), attached=attach_sync_probe("cuda"))
    ok, why = attach_sync_verdict(fig["plain"], fig["attached"])
    if not ok:
        raise CheckFailed(why, fig)
    return f"an attached DDP on NCCL: {why}", fig


def check_launched_sync() -> tuple[str, dict[str, Any]]:
    from ddpviz.engine.harness.launched_sync import LAUNCHED_CFG, launched_sync_probe, launched_sync_verdict

    fig = launched_sync_probe("cuda")
    ok, why = launched_sync_verdict(fig, LAUNCHED_CFG["steps"])
    if not ok:
        raise CheckFailed(why, fig)
    return f"a launched DDP rank on NCCL: {why}", fig


# The overhead check's runs (issue 31.1): the small GPT at 0.1, 1 and 25 MB and the 99.5 M GPT at 25 and 1 MB
# (0.1 MB would be ~1,000 buckets a step), each on both bucket paths
OVERHEAD_MODELS = dict(gpt_256x4=dict(SMALL_GPT, world_size=1),
                       gpt_100m=dict(GPT_100M, world_size=1, global_batch_size=8, device="cuda", eval_every=0,
                                     step_delay_s=0.0))
OVERHEAD_SERIES = (("gpt_256x4", "hook", (25.0, 1.0, 0.1)), ("gpt_256x4", "recorder", (25.0, 1.0, 0.1)),
                   ("gpt_100m", "hook", (25.0, 1.0)), ("gpt_100m", "recorder", (25.0, 1.0)))
OVERHEAD_ROUNDS, OVERHEAD_BLOCK_STEPS = 8, 20


def check_overhead() -> tuple[str, dict[str, Any]]:
    """Instrumented vs plain DDP, one GPU, at each of `OVERHEAD_SERIES`' caps, with µs per bucket
    (`workers.doctor.cost.check_gpu_bucket_cost`, issue 31.1 and 31.6)."""
    from ddpviz.workers.doctor.cost import check_gpu_bucket_cost

    return check_gpu_bucket_cost(OVERHEAD_MODELS, OVERHEAD_SERIES, OVERHEAD_ROUNDS, OVERHEAD_BLOCK_STEPS)


def check_multi_gpu() -> tuple[str, dict[str, Any]]:
    import torch

    from ddpviz.engine.config import RunConfig
    from ddpviz.engine.events import ListSink
    from ddpviz.engine.harness.gpu_checks import memory_imbalance
    from ddpviz.engine.run import run_training

    n = torch.cuda.device_count()
    if n < 2:
        raise CheckSkipped(f"{n} GPU visible: the DP/DDP pair at world_size = GPU count needs 2 or more")
    fig: dict[str, Any] = dict(world_size=n)
    for mode in ("dp", "ddp"):
        sink = ListSink()
        r = run_training(RunConfig(mode=mode, world_size=n, steps=10, **{**SMALL_GPT, "global_batch_size": 8 * n}),
                         sink, f"doctor-{mode}-{n}gpu")
        fig[mode] = dict(status=r.status, samples_per_s=r.summary.get("samples_per_s"),
                         error=(r.error or {}).get("exception"), **memory_imbalance(sink.events))
    if fig["dp"]["status"] != "succeeded" or fig["ddp"]["status"] != "succeeded":
        raise CheckFailed("a run failed", fig)
    return (f"device 0 hot spot: DP max/min peak memory {fig['dp']['max_over_min']:.2f}x, "
            f"DDP {fig['ddp']['max_over_min']:.2f}x", fig)


def check_queue_runs(stack, state: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    from ddpviz.workers.doctor.report import run_figures

    client = stack.client()
    cfg = dict(SMALL_GPT, world_size=1, steps=30, bucket_cap_mb=1.0)
    ids = {m: client.submit({**cfg, "mode": m}, label=f"doctor GPU {m.upper()}") for m in ("dp", "ddp")}
    recs = stack.wait(list(ids.values()))
    fig = {m: run_figures(client, recs[rid]) for m, rid in ids.items()}
    bad = [f"{m} {f['status']} ({f['error']})" for m, f in fig.items() if f["status"] != "succeeded"]
    if bad:
        raise CheckFailed("; ".join(bad), fig)
    state["queue_runs"] = ids
    return "a DP and a DDP run on cuda:0 went through the queue and finished", fig


def check_screenshots(stack, state: dict[str, Any], out_dir: Path) -> tuple[str, dict[str, Any]]:
    from ddpviz.workers.doctor.shots import take_screenshots

    if "queue_runs" not in state:
        raise CheckSkipped("no GPU runs in Redis to show (gpu_runs_through_queue did not pass)")
    paths = take_screenshots(stack, state["queue_runs"], out_dir)
    return f"{len(paths)} screenshots in {out_dir}", dict(paths=[str(p) for p in paths])


if __name__ == "__main__":  # the GPU series alone, as JSON: python -m ddpviz.workers.doctor.gpu OUT [model:timing]
    import json
    import sys

    from ddpviz.workers.doctor.cost import check_gpu_bucket_cost
    from ddpviz.workers.doctor.report import CheckFailed as _Failed

    if len(sys.argv) < 2:
        sys.exit("usage: python -m ddpviz.workers.doctor.gpu OUT.json [model:timing ...]")
    wanted = set(sys.argv[2:])  # "model:timing" to run only those series (default: all)
    known = {f"{m}:{t}" for m, t, _ in OVERHEAD_SERIES}
    if wanted - known:
        sys.exit(f"unknown series {sorted(wanted - known)}; known: {sorted(known)}")
    series = tuple(s for s in OVERHEAD_SERIES if not wanted or f"{s[0]}:{s[1]}" in wanted)
    import torch

    if not torch.cuda.is_available():
        sys.exit("no CUDA device visible: these series run on a GPU (on CPU: `ddpviz doctor`'s bucket_cost_cpu)")
    try:
        line, figures = check_gpu_bucket_cost(OVERHEAD_MODELS, series, OVERHEAD_ROUNDS, OVERHEAD_BLOCK_STEPS)
    except _Failed as exc:
        line, figures = str(exc), exc.figures
    print(line)
    with open(sys.argv[1], "w") as f:
        json.dump(figures, f, indent=1, default=str)
