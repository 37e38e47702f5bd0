"""The `comm_volume` events of an attached process: one per step for all its DDPs (`VolumeBook`)."""

from __future__ import annotations

from typing import Any

from ddpviz.engine.analysis import ring_factor
from ddpviz.engine.attach.session import Session


class VolumeBook:
    """One `comm_volume` event per step for every DDP of the process (docs/events.md: one per
    device and step). A step's event is written once the step has ended (`close`, from the step
    tracker) and every DDP that all-reduced in it has handed over its buckets (`add`; on CUDA that
    comes at a later step's end, when the bucket's CUDA events completed). Bytes: Σ over those
    DDPs of the bytes their comm hook handed to all-reduce (in every synced backward of the step:
    `carry` brings those before the last); `sent_bytes`/`recv_bytes` each DDP's
    bytes × its ring factor 2(n−1)/n, summed; `theory_*`: the same factor × each DDP's gradient
    bytes, summed; `ddp_count`: how many DDPs the step's bytes came from."""

    def __init__(self, session: Session):
        self.s = session
        self.steps: dict[int, dict[str, Any]] = {}  # step -> {expect, got, closed}

    def _entry(self, step: int) -> dict[str, Any]:
        return self.steps.setdefault(step, dict(expect=set(), got={}, closed=False))

    def expect(self, step: int, watch: Any) -> None:
        """`watch` all-reduced in `step`: its buckets are due before the step's event."""
        self._entry(step)["expect"].add(watch.ddp_index)

    def carry(self, step: int, watch: Any, nbytes: int) -> None:
        """`watch` all-reduced `nbytes` more in `step`, in synced backwards before its last one."""
        if nbytes:
            carried = self._entry(step).setdefault("carried", {})
            carried[watch.ddp_index] = carried.get(watch.ddp_index, 0) + nbytes

    def add(self, step: int, watch: Any, out: list[dict[str, Any]]) -> None:
        """`watch`'s bucket records of `step` (as emitted)."""
        self._entry(step)["got"][watch.ddp_index] = (watch, out)
        self._flush(step)

    def close(self, step: int) -> None:
        """`step` has ended: no DDP will all-reduce in it any more."""
        if step in self.steps:
            self.steps[step]["closed"] = True
            self._flush(step)

    def _flush(self, step: int) -> None:
        e = self.steps[step]
        if not e["closed"] or not e["expect"] <= set(e["got"]):
            return
        del self.steps[step]
        for older in [s for s, o in self.steps.items() if s < step and o["closed"]]:
            del self.steps[older]  # a DDP whose timing went off since: its buckets will not come
        parts = [e["got"][i] for i in sorted(e["got"])]
        self.s.emit("comm_volume", step=step, **volume_fields(parts, e.get("carried", {})))


def volume_fields(parts: list[tuple[Any, list[dict[str, Any]]]], carried: dict[int, int]) -> dict[str, Any]:
    """A step's `comm_volume` fields (`VolumeBook`) from each DDP that all-reduced in it: `parts` are (its watch,
    its bucket records as emitted), `carried` the bytes of its synced backwards before the last, by `ddp_index`.
    Sizes in bytes; the ring factor is `engine.analysis.ring_factor`."""
    sent = theory = nbytes = 0
    for watch, out in parts:
        ring = ring_factor(watch.world_size)
        b = sum(r["nbytes"] or 0 for r in out) + carried.get(watch.ddp_index, 0)
        nbytes, sent, theory = nbytes + b, sent + int(ring * b), theory + int(ring * watch.param_bytes)
    sources = list(dict.fromkeys(out[0]["nbytes_source"] for _, out in parts if out))
    return dict(allreduce_bytes=nbytes, sent_bytes=sent, recv_bytes=sent, volume_source="derived (ring all-reduce)",
                allreduce_bytes_source="; ".join(sources) or None, theory_sent_bytes=theory,
                theory_recv_bytes=theory, world_size=parts[0][0].world_size, ddp_count=len(parts))
