"""Hand-built event lists following docs/events.md (schema 1), for tests without a real run.

The numbers are shaped like a 2-device CPU run of the default mlp on digits: DDP all-reduces
3 buckets per rank per step that overlap the backward pass; DP runs the 8 phases per device.
"""

from __future__ import annotations

from typing import Any

T0 = 1_700_000_000.0
MIB = 1024 * 1024


def _ev(type_: str, run_id: str, ts: float, **fields: Any) -> dict[str, Any]:
    return {"type": type_, "run_id": run_id, "ts": ts, **fields}


def run_started(run_id: str, mode: str, world_size: int = 2, steps: int = 4) -> dict[str, Any]:
    cfg = {"mode": mode, "world_size": world_size, "model": "mlp", "dataset": "digits",
           "steps": steps, "global_batch_size": 64, "bucket_cap_mb": 25.0, "overlap": True}
    return _ev("run_started", run_id, T0, schema_version=1, config=cfg, mode=mode,
               world_size=world_size, backend="gloo" if mode == "ddp" else None,
               devices=[{"name": f"cpu:{i}", "kind": "cpu", "total_memory_bytes": None}
                        for i in range(world_size)],
               emulated=mode == "dp", torch_version="2.13.0", host="test", param_count=30000,
               grad_bytes=120000, micro_batch_per_device=64 // world_size)


def ddp_step(run_id: str, step: int, world_size: int = 2, *, buckets: int = 3,
             complete: bool = True) -> list[dict[str, Any]]:
    """Per rank: `step`, buckets (ready 2, 4, 6 ms; all-reduce 1 ms after ready, 1.5 ms long),
    memory and comm_volume. `complete=False` leaves out the last rank's last bucket."""
    out, ts = [], T0 + 1 + step * 0.05
    for rank in range(world_size):
        out.append(_ev("step", run_id, ts, rank=rank, device=f"cpu:{rank}", step=step, loss=2.3,
                       samples=64, step_time_s=0.020 + 0.001 * rank, forward_s=0.004,
                       backward_s=0.008, comm_exposed_s=0.002, optimizer_s=0.003,
                       samples_per_s=64 / (0.020 + 0.001 * rank)))
        for b in range(buckets):
            if not complete and rank == world_size - 1 and b == buckets - 1:
                continue
            ready = 0.002 * (b + 1)
            out.append(_ev("bucket", run_id, ts, rank=rank, step=step, bucket_index=b,
                           nbytes=40000 * (b + 1), num_params=2, ready_s=ready,
                           comm_start_s=ready + 0.001, comm_end_s=ready + 0.0025,
                           is_last=b == buckets - 1))
        out.append(memory(run_id, ts, step, rank, f"cpu:{rank}", 3 * MIB, shared=False,
                          phases=[["forward", 0.001, 0.005], ["backward", 0.005, 0.015],
                                  ["optimizer", 0.017, 0.020]]))
        out.append(_ev("comm_volume", run_id, ts, rank=rank, device=f"cpu:{rank}", step=step,
                       allreduce_bytes=120000, sent_bytes=120000, recv_bytes=120000,
                       volume_source="derived (ring all-reduce)", theory_sent_bytes=120000,
                       theory_recv_bytes=120000))
    return out


def memory(run_id: str, ts: float, step: int, rank: int, device: str, peak: int, *,
           shared: bool, phases: list) -> dict[str, Any]:
    """A traced step's `memory` event: live tensors rise from peak/2 to `peak` and fall back to
    peak/2 over 20 ms; the process holds 500 MiB throughout."""
    half = peak // 2
    return _ev("memory", run_id, ts, rank=rank, device=device, step=step, source="tensors",
               allocated_bytes=half, peak_allocated_bytes=peak, tensors_peak_bytes=peak,
               reserved_bytes=None, used_bytes=None, process_rss_bytes=500 * MIB,
               process_shared=shared, breakdown={"params": half, "activations": peak - half},
               step_span_s=0.02, phases=phases,
               curve={"tensors": [[0.0, half], [0.006, peak], [0.02, half]],
                      "process": [[0.0, 500 * MIB], [0.02, 500 * MIB]]},
               sampler={"interval_s": 0.05, "readings": 2, "window_s": 0.05,
                        "window_peak_bytes": {"process": 500 * MIB, "tensors": peak}})


def dp_step(run_id: str, step: int, world_size: int = 2) -> list[dict[str, Any]]:
    """One step event (rank 0), the 8 phases per device (device 0 reduces and steps alone)."""
    ts = T0 + 1 + step * 0.05
    out = [_ev("step", run_id, ts, rank=0, step=step, loss=2.3, samples=64, step_time_s=0.032,
               forward_s=0.006, backward_s=0.010, comm_exposed_s=0.009, optimizer_s=0.004,
               samples_per_s=64 / 0.032)]
    spans = [("broadcast", 0, 3), ("scatter", 3, 5), ("forward", 5, 11), ("gather", 11, 13),
             ("loss", 13, 14), ("backward", 14, 24), ("reduce", 24, 28), ("optimizer", 28, 32)]
    for d in range(world_size):
        for phase, a, b in spans:
            if phase == "optimizer" and d > 0:
                continue
            nbytes = 120000 if phase in ("broadcast", "reduce", "scatter", "gather") else 0
            out.append(_ev("dp_phase", run_id, ts, rank=0, device=f"cpu:{d}", step=step,
                           phase=phase, start_s=a / 1000, end_s=b / 1000, nbytes=nbytes))
        out.append(memory(run_id, ts, step, 0, f"cpu:{d}", (4 if d == 0 else 2) * MIB, shared=True,
                          phases=[[p, a / 1000, b / 1000] for p, a, b in spans
                                  if d == 0 or p != "optimizer"]))
        sent = 120000 * (world_size - 1) if d == 0 else 120000
        out.append(_ev("comm_volume", run_id, ts, rank=0, device=f"cpu:{d}", step=step,
                       sent_bytes=sent, recv_bytes=sent, volume_source="measured",
                       theory_sent_bytes=sent, theory_recv_bytes=sent))
    return out


def run_finished(run_id: str, steps: int, status: str = "succeeded",
                 error: dict[str, Any] | None = None) -> dict[str, Any]:
    summary = {"steps_done": steps, "samples_per_s": 3000.0, "step_time_s": 0.021,
               "overlap": 0.6, "final_loss": 2.0, "replicas_in_sync": True}
    return _ev("run_finished", run_id, T0 + 2 + steps * 0.05, status=status, error=error,
               summary=summary)


def full_run(run_id: str, mode: str, steps: int = 4, world_size: int = 2) -> list[dict[str, Any]]:
    """run_started, `steps` steps of `mode` (dp or ddp), run_finished."""
    body = [e for s in range(steps)
            for e in (ddp_step if mode == "ddp" else dp_step)(run_id, s, world_size)]
    return [run_started(run_id, mode, world_size, steps), *body, run_finished(run_id, steps)]
