"""Runs one job in this process (single, DP) or in rank processes (DDP, FSDP) and reports it.

Order of events: `run_started` (after pre-flight checks), the run's own events, `run_finished`
(always, with status succeeded|failed|canceled and a summary built from the events). A failure
says where it happened (`stage`, see `engine.stages`) and keeps its traceback.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

from ddpviz.engine.components.devices import DevicePlan, PreflightError, available_memory, resolve_plan
from ddpviz.engine.components.loop import Canceled
from ddpviz.engine.components.preflight import check_model, check_model_fits, probe_batch
from ddpviz.engine.components.training import cpu_threads_per_rank, flat_params
from ddpviz.engine.config import BUILTIN_MODELS, SCHEMA_VERSION, RunConfig
from ddpviz.engine.data import load_dataset
from ddpviz.engine.events import EventSink, make_event
from ddpviz.engine.measure.sync import param_checksum
from ddpviz.engine.measure.telemetry import Telemetry
from ddpviz.engine.models import build_model, builtin_param_count, grad_bytes, param_count
from ddpviz.engine.result import RunResult
from ddpviz.engine.summary import SummaryBuilder


class _Observed:
    """Forwards events to `sink` while the summary builder watches them."""

    def __init__(self, sink: EventSink, builder: SummaryBuilder):
        self.sink, self.builder = sink, builder

    def emit(self, event: dict[str, Any]) -> None:
        self.builder.observe(event)
        self.sink.emit(event)

    def close(self) -> None:
        pass


def error_dict(exc: BaseException, rank: int | None = 0, stage: str | None = None,
               step: int | None = None) -> dict[str, Any]:
    """`{stage, rank, step, exception, traceback}` for a `run_finished` event."""
    text = f"{exc.field}: {exc}" if isinstance(exc, PreflightError) else f"{type(exc).__name__}: {exc}"
    return dict(stage=stage, rank=rank, step=step, exception=text,
                traceback="".join(traceback.format_exception(exc)))


def comm_hook_refusal(cfg: RunConfig) -> str | None:
    """The pre-flight refusal a DDP run of `cfg` with a comm hook meets before it trains
    (`engine.modes.ddp.comm_hooks.check_comm_hook` against its backend and DDP's bucket layout), in the
    words its error would carry ("<field>: <rule>"); None when it passes, or when something else fails
    first (the run's own pre-flight reports that, with its stage). For a pair's job: its DP run must not
    train alone for a comparison its DDP partner is refused before training."""
    if cfg.mode != "ddp" or cfg.comm_hook == "none":
        return None
    from ddpviz.engine.modes.ddp.buckets import preview_buckets
    from ddpviz.engine.modes.ddp.comm_hooks import check_comm_hook

    try:
        plan, ds = resolve_plan(cfg), load_dataset(cfg)
        model = build_model(cfg, ds)
        check_comm_hook(cfg, plan.backend, preview_buckets(cfg, model, *probe_batch(cfg, ds))["rebuilt"])
    except PreflightError as exc:
        return f"{exc.field}: {exc}"
    except Exception:  # noqa: BLE001 - not this check's to report
        return None
    return None


def _cpu_fields(cfg: RunConfig, plan: DevicePlan) -> dict[str, Any]:
    """The host's cores and each virtual CPU device's intra-op threads (None on CUDA; the single
    baseline is one device of the same size): what the scale-out predictor needs to rescale CPU
    compute to another world size (engine/predict/scaleout.py)."""
    if plan.kind != "cpu":
        return dict(host_cpu_count=os.cpu_count(), cpu_threads_per_device=None)
    return dict(host_cpu_count=os.cpu_count(),
                cpu_threads_per_device=cpu_threads_per_rank(cfg.world_size))


def _failure(exc: BaseException, stage: str) -> dict[str, Any]:
    """The error of a run that raised `exc` while in `stage` (training errors name rank and step:
    a rank's own report from `engine.modes.launcher`, else the step `engine.components.loop.drive` was in)."""
    if stage != "training":
        return error_dict(exc, rank=None, stage=stage)
    reported = getattr(exc, "error", None)
    if reported:
        return {"stage": stage, "step": None, **reported}
    return error_dict(exc, rank=getattr(exc, "rank", 0), stage=stage, step=getattr(exc, "step", None))


def _started_fields(cfg: RunConfig, plan: DevicePlan, model: torch.nn.Module, ds,
                    host: str | None, bucket_preview: dict[str, Any] | None = None) -> dict[str, Any]:
    """`run_started`'s fields. `host` is the worker's name where the engine knows it (a node of a
    multi-host run; a single-host job's worker fills it in, `workers.jobs.run`), the machine's name
    is `hostname`. `bucket_preview`: DDP's (`preview_buckets`, worked out in pre-flight)."""
    extra: dict[str, Any] = {}
    if cfg.mode == "ddp":
        extra["bucket_preview"] = bucket_preview
    if cfg.mode == "fsdp":
        from ddpviz.engine.modes.fsdp.units import fsdp_preview

        extra["fsdp_units"] = fsdp_preview(cfg, model)
    # a single run trains on one device, whatever world size its config keeps (a set's: it computes that many
    # devices' global batch, `devices_used`): its record says one device and the batch it processes (a new user read
    # a trio's single run exported as world_size 2, micro-batch 128, 2026-12-06)
    one = cfg.mode == "single"
    return dict(extra, schema_version=SCHEMA_VERSION, config=cfg.to_json_dict(), mode=cfg.mode,
                world_size=1 if one else cfg.world_size, backend=plan.backend, devices=plan.infos,
                device_names=plan.names, emulated=plan.emulated, torch_version=torch.__version__,
                host=host or None, hostname=socket.gethostname(), dataset_name=ds.name,
                param_count=param_count(model), grad_bytes=grad_bytes(model),
                micro_batch_per_device=cfg.global_batch_size // cfg.grad_accum_steps if one
                else cfg.micro_batch_per_device, **_cpu_fields(cfg, plan),
                sampler=dict(kind="DistributedSampler", shuffle=True, drop_last=True,
                             policy="drop_last: every rank gets len(dataset) // world_size samples and "
                                    "the same number of full batches, so no collective waits for a rank"),
                train_samples=len(ds), val_samples=len(ds.x_val))


def execute(cfg: RunConfig, sink: EventSink, run_id: str, *,
            should_stop: Callable[[], bool] | None = None,
            workdir: str | Path | None = None, node=None) -> RunResult:
    """See `engine.run.run_training`."""
    builder = SummaryBuilder()
    out = _Observed(sink, builder)
    t0 = time.time()
    result = RunResult(status="succeeded")
    tmp = None
    stage = "pre-flight"
    try:
        plan = resolve_plan(cfg)
        stage = "dataset"
        ds = load_dataset(cfg)
        stage = "pre-flight"  # before a model too large for the host is built
        check_model_fits(cfg, plan, builtin_param_count(cfg, ds), available_memory(plan))
        stage = "model build" if cfg.model in BUILTIN_MODELS else "plugin build"
        model = build_model(cfg, ds)
        stage = "pre-flight"
        check_model(cfg, model, ds)
        if cfg.mode == "fsdp":
            from ddpviz.engine.modes.fsdp.units import check_fsdp

            check_fsdp(cfg, plan, model)
        preview = None
        if cfg.mode == "ddp":
            from ddpviz.engine.modes.ddp.buckets import preview_buckets
            from ddpviz.engine.modes.ddp.comm_hooks import check_comm_hook

            preview = preview_buckets(cfg, model, *probe_batch(cfg, ds))
            check_comm_hook(cfg, plan.backend, preview["rebuilt"])
        started = _started_fields(cfg, plan, model, ds, node.host_label if node else None, preview)
        out.emit(make_event("run_started", run_id, rank=0, device=plan.names[0], **started))
        if workdir is None:
            tmp = tempfile.TemporaryDirectory(prefix=f"ddpviz-{run_id}-")
            workdir = tmp.name
        stage = "training"
        result.final_params = _dispatch(cfg, plan, ds, model, out, run_id, should_stop, Path(workdir), node)
    except Canceled as exc:
        result.status, result.error = "canceled", dict(rank=None, exception=str(exc), traceback="")
    except Exception as exc:
        result.status, result.error = "failed", _failure(exc, stage)
    finally:
        result.summary = _summary(builder)
        result.summary["wall_time_s"] = time.time() - t0
        out.emit(make_event("run_finished", run_id, rank=0, status=result.status,
                            error=result.error, summary=result.summary))
        if tmp is not None:
            tmp.cleanup()
    return result


def _summary(builder: SummaryBuilder) -> dict[str, Any]:
    """The run's summary; should building it fail, what can be said (`summary_error`), so that
    `run_finished` is written whatever the events held."""
    try:
        return builder.summary()
    except Exception as exc:  # a bug in the summary must not lose the run's ending
        return {"steps_done": len(builder.steps.get(0, {})), "summary_error": f"{type(exc).__name__}: {exc}"}


def _dispatch(cfg, plan: DevicePlan, ds, model, out, run_id, should_stop, workdir: Path, node=None):
    """Train in the mode asked for; returns the final parameters as a flat CPU tensor."""
    if cfg.mode in ("ddp", "fsdp"):  # one launcher, a rank function per mode
        from ddpviz.engine.modes.launcher import launch_ranks

        if cfg.mode == "ddp":
            from ddpviz.engine.modes.ddp.rank import rank_main
        else:
            from ddpviz.engine.modes.fsdp.rank import rank_main
        return launch_ranks(cfg, plan, out, run_id, should_stop, workdir, node, rank_fn=rank_main)
    tel = Telemetry(out, run_id, rank=0, device=plan.names[0])
    if cfg.mode == "single":
        from ddpviz.engine.modes.single import train_single

        trained = train_single(cfg, ds, model, torch.device(plan.names[0] if plan.kind == "cuda" else "cpu"),
                               tel, should_stop)
        # one device: no replica to compare with, so no verdict (null), only its checksum
        tel.emit("sync", step=cfg.steps - 1, checksums=[param_checksum(trained)], in_sync=None,
                 checked="single device: nothing to compare")
    else:
        from ddpviz.engine.modes.dp.emulated import train_dp

        trained = train_dp(cfg, plan, ds, model, tel, should_stop)
    return flat_params(trained)
