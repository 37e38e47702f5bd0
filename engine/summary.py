"""A run's summary, built from the events it emitted (the same numbers the UI shows).

overlap = 1 − exposed comm / total comm (README, "How the numbers are made"), where total comm per step is the length of the
union of the bucket all-reduce intervals on rank 0, and exposed comm is the step's `comm_exposed_s`.
Medians skip warm-up steps (the first `WARMUP_STEPS`, fewer for short runs) and the steps whose
time includes the instrument's own work — memory tracing (`memory_traced`) or DP's replica
checksums (`replica_check`) — while at least half the steps remain. Peak memory per device is the largest measured `peak_allocated_bytes` of its `memory`
events (the live-tensor ledger's maximum on CPU, the CUDA allocator's on GPU), never an estimate.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

WARMUP_STEPS = 3
VOLUME_KEYS = ("sent_bytes", "recv_bytes", "volume_source", "allreduce_bytes", "theory_sent_bytes",
               "theory_recv_bytes")
SPLIT_KEYS = ("step_time_s", "forward_s", "backward_s", "comm_exposed_s", "optimizer_s", "samples_per_s")


def interval_union_s(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by the intervals (seconds)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


class SummaryBuilder:
    """Observes events (`observe`) and returns the `run_finished` summary (`summary`)."""

    def __init__(self) -> None:
        self.steps: dict[int, dict[int, dict]] = defaultdict(dict)  # rank -> step -> step event
        self.bucket_spans: dict[int, list[tuple[float, float]]] = defaultdict(list)  # rank-0 step -> spans
        self.dp_comm: dict[int, float] = defaultdict(float)
        self.peak: dict[str, int] = {}
        self.memory_sources: set[str] = set()
        self.volume: dict[str, dict[str, int]] = {}
        self.last_eval: dict | None = None
        self.sync: dict | None = None

    def observe(self, e: dict[str, Any]) -> None:
        t = e.get("type")
        if t == "step":
            self.steps[e.get("rank", 0)][e["step"]] = e
        elif t == "bucket" and e.get("rank", 0) == 0:
            self.bucket_spans[e["step"]].append((e["comm_start_s"], e["comm_end_s"]))
        elif t == "memory":
            dev, peak = e["device"], e.get("peak_allocated_bytes")
            peak = peak if peak is not None else e.get("allocated_bytes")
            if peak is not None:
                self.peak[dev] = max(self.peak.get(dev, 0), int(peak))
                self.memory_sources.add(str(e.get("source")))
        elif t == "comm_volume":
            self.volume[e["device"]] = {k: e.get(k) for k in VOLUME_KEYS if k in e}
        elif t == "eval":
            self.last_eval = e
        elif t == "sync":
            self.sync = e

    def _steady(self) -> list[dict]:
        rank0 = [self.steps[0][s] for s in sorted(self.steps.get(0, {}))]
        skip = min(WARMUP_STEPS, len(rank0) // 4)
        late = rank0[skip:] or rank0
        plain = [e for e in late if not (e.get("memory_traced") or e.get("replica_check"))]
        return plain if len(plain) * 2 >= len(late) else late

    def overlap(self) -> float | None:
        """1 − Σ exposed / Σ total comm over steady steps with buckets (None without comm)."""
        total = exposed = 0.0
        for e in self._steady():
            spans = self.bucket_spans.get(e["step"])
            if spans:
                total += interval_union_s(spans)
                exposed += min(e["comm_exposed_s"], interval_union_s(spans))
            elif e["comm_exposed_s"] > 0:  # DP: every copy is on the critical path
                total += e["comm_exposed_s"]
                exposed += e["comm_exposed_s"]
        return None if total <= 0 else max(0.0, 1.0 - exposed / total)

    def summary(self) -> dict[str, Any]:
        steady = self._steady()
        out: dict[str, Any] = {"steps_done": len(self.steps.get(0, {}))}
        for k in SPLIT_KEYS:
            out[k] = statistics.median(e[k] for e in steady) if steady else None
        rank0 = [self.steps[0][s] for s in sorted(self.steps.get(0, {}))]
        # DDP: each rank's loss is the mean over its own shard (equal sizes), so the global-batch
        # loss is the mean over ranks of their last step's loss.
        last = [self.steps[r][max(self.steps[r])] for r in self.steps if self.steps[r]]
        final_step = max((e["step"] for e in last), default=None)
        finals = [e["loss"] for e in last if e["step"] == final_step]
        out["final_loss"] = sum(finals) / len(finals) if finals else None
        out["overlap"] = self.overlap()
        out["peak_memory_bytes"] = dict(sorted(self.peak.items()))
        if self.peak:
            lo = min(self.peak.values())
            out["memory_imbalance"] = max(self.peak.values()) / lo if lo else None
            out["memory_source"] = ", ".join(sorted(self.memory_sources))
        out["bytes_per_device"] = dict(sorted(self.volume.items()))
        out["val_loss"] = self.last_eval["val_loss"] if self.last_eval else None
        out["val_accuracy"] = self.last_eval["val_accuracy"] if self.last_eval else None
        out["replicas_in_sync"] = self.sync["in_sync"] if self.sync else None
        out["param_checksums"] = self.sync["checksums"] if self.sync else None
        return out
