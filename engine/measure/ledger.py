"""Live-tensor ledger: the bytes of the tensor storages that exist right now, per device and kind.

While a `LedgerMode` (a `TorchDispatchMode`, torch/utils/_python_dispatch.py) is entered in a
thread, every aten op that thread runs — forward, the autograd backward it drives, the optimizer,
the copies DP makes — passes through it, and each output storage seen for the first time is added
to the ledger under the device that thread works for. A storage leaves the ledger when PyTorch
frees it: the Python `UntypedStorage` object lives exactly as long as the storage (PyObject
preservation), so a `weakref` callback on it fires at the free. This is the mechanism of
`torch.distributed._tools.mem_tracker.MemTracker`; ddpviz keeps its own because MemTracker has
one global view (no per-thread device, which the DP emulation needs), global module and optimizer
hooks, and no time series.

Tensors that exist before tracing starts (parameters, gradients, optimizer state, buffers, DDP's
bucket buffers) are added with `add_existing`. Totals are exact at every change, so
`peaks` is the measured maximum, not a sample of it. Only storages are counted: a view adds
nothing, a storage shared by two tensors counts once. CPU tensors are attributed to the thread's
virtual device; on a CUDA ledger (`device_type="cuda"`) only CUDA tensors count, each on its own
GPU's index when the ledger keeps several (DP on GPUs; not run on a GPU yet).
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections import defaultdict
from typing import Any, Iterable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_map_only

from ddpviz.engine.measure.telemetry import now

# Kinds a storage is filed under. Existing tensors carry their role; new ones the phase that made
# them (DP names its phases; DDP/single learn forward and backward from hooks, see `kind_for_new`).
KINDS = ("params", "buffers", "grads", "optimizer_state", "bucket_buffers", "inputs", "activations",
         "backward", "loss", "gathered_outputs", "grad_copies", "optimizer", "unsharded_params",
         "comm_buffers", "other")


class TensorLedger:
    """Bytes of live storages per device (index 0..n-1) and kind, with the curve and the peak.

    Args:
        n_devices: devices the ledger keeps apart (DP: the virtual devices; DDP/single: 1).
        device_type: "cpu" or "cuda"; on "cuda" only CUDA storages are counted.

    Attributes (valid between `begin` and the next `begin`):
        totals: bytes live now per device.
        peaks: the largest `totals[i]` since `begin` (bytes).
        peak_kinds: bytes by kind at the moment of each device's peak.
        points: per device, ``(perf_counter s, total bytes)`` after every change.
    """

    def __init__(self, n_devices: int = 1, device_type: str = "cpu"):
        self.n, self.device_type = n_devices, device_type
        self.active = False
        self._lock = threading.RLock()  # a free can fire inside an add (a dropped last reference)
        self._local = threading.local()
        self._reset()

    def _reset(self) -> None:
        # id(storage) -> (device, kind, nbytes, weakref, perf_counter s when counted)
        self._entries: dict[int, tuple[int, str, int, weakref.ref, float]] = {}
        self.totals = [0] * self.n
        self.peaks = [0] * self.n
        self.kinds: list[dict[str, int]] = [defaultdict(int) for _ in range(self.n)]
        self.peak_kinds: list[dict[str, int]] = [{} for _ in range(self.n)]
        self.peak_t = [0.0] * self.n
        self.points: list[list[tuple[float, int]]] = [[] for _ in range(self.n)]

    # ---- tracing window ------------------------------------------------------------------------
    def begin(self) -> None:
        """Forget the last window and start counting (call before `add_existing`)."""
        with self._lock:
            self._reset()
            self.active = True

    def end(self) -> None:
        """Stop counting; totals, peaks and points stay readable until the next `begin`."""
        with self._lock:
            self.active = False
            self._entries = {}  # drops the weakrefs, so later frees call nothing

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Count nothing in the block (the instrument's own tensors, e.g. checksums)."""
        was, self.active = self.active, False
        try:
            yield
        finally:
            self.active = was

    # ---- which device and kind this thread works for ---------------------------------------------
    @property
    def device(self) -> int:
        return getattr(self._local, "device", 0)

    @contextlib.contextmanager
    def working_for(self, device: int | None = None, kind: str | None = None) -> Iterator[None]:
        """Attribute storages this thread creates in the block to `device`, filed as `kind`."""
        old = (getattr(self._local, "device", 0), getattr(self._local, "kind", None))
        self._local.device = old[0] if device is None else device
        self._local.kind = old[1] if kind is None else kind
        try:
            yield
        finally:
            self._local.device, self._local.kind = old

    def set_kind(self, kind: str | None) -> None:
        """File storages this thread creates from now on as `kind` (None: by autograd state)."""
        self._local.kind = kind

    def kind_for_new(self) -> str:
        """The kind of a storage created now: inside a backward pass "backward" (autograd's own
        state); else the thread's kind if set; else "activations" with grad mode on, "optimizer"
        with it off (optimizers step under no_grad)."""
        if torch._C._current_graph_task_id() != -1:
            return "backward"
        kind = getattr(self._local, "kind", None)
        if kind is not None:
            return kind
        return "activations" if torch.is_grad_enabled() else "optimizer"

    # ---- bookkeeping -----------------------------------------------------------------------------
    def add(self, t: torch.Tensor, kind: str | None = None, device: int | None = None) -> None:
        """Count `t`'s storage if it is new (a storage already counted is left as it is)."""
        if not self.active or not isinstance(t, torch.Tensor):
            return
        if self.device_type == "cuda" and t.device.type != "cuda":
            return
        if t.layout == torch.sparse_coo or is_traceable_wrapper_subclass(t):
            for part in _dense_parts([t]):  # sparse: indices and values; DTensor: its local shard
                self.add(part, kind, device)
            return
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse, nested, meta: no plain storage
            return
        key = id(st)
        entry = self._entries.get(key)
        if entry is not None:
            if entry[2] != st.nbytes():  # resized in place since it was counted (FSDP2 at world size 1)
                self.resized([t], entry[1])
            return
        nbytes = st.nbytes()
        if nbytes == 0:
            return
        if device is not None:
            dev = device
        elif self.device_type == "cuda" and self.n > 1:  # DP on GPUs: the tensor's own device
            dev = t.device.index or 0
        else:
            dev = self.device
        kind = kind or self.kind_for_new()
        with self._lock:
            if not self.active or key in self._entries:
                return
            ref = weakref.ref(st, lambda _r, key=key: self._free(key))
            self._entries[key] = (dev, kind, nbytes, ref, now())
            self._change(dev, kind, nbytes)

    def add_existing(self, tensors: Iterable[torch.Tensor | None], kind: str,
                     device: int | None = None) -> None:
        """Count tensors that existed before `begin` (parameters, gradients, state, buffers)."""
        for t in tensors:
            if t is not None:
                self.add(t, kind, device)

    def retag(self, tensors: Iterable[torch.Tensor | None], kind: str) -> None:
        """File the storages of counted `tensors` under `kind` (e.g. a gradient once it lands in
        `.grad`). A storage counted before the device's peak and alive now was alive at the peak,
        so the peak's breakdown is corrected too."""
        with self._lock:
            for t in _dense_parts(tensors):
                if not self.active:
                    continue
                key = id(t.untyped_storage())
                entry = self._entries.get(key)
                if entry is None or entry[1] == kind:
                    continue
                dev, old, nbytes, ref, born = entry
                self.kinds[dev][old] -= nbytes
                self.kinds[dev][kind] += nbytes
                if born <= self.peak_t[dev]:
                    pk = self.peak_kinds[dev]
                    pk[old] = pk.get(old, 0) - nbytes
                    pk[kind] = pk.get(kind, 0) + nbytes
                    if not pk[old]:
                        del pk[old]
                self._entries[key] = (dev, kind, nbytes, ref, born)

    def resized(self, tensors: Iterable[torch.Tensor | None], kind: str) -> None:
        """Re-read the bytes of `tensors`' storages after an in-place `UntypedStorage.resize_`,
        which no aten op shows: FSDP2 frees each unit's gathered parameters by resizing their
        storage to 0 and re-allocates it the same way (`FSDPParam.free_unsharded_param`,
        `alloc_all_gather_outputs`, torch/distributed/fsdp/_fully_shard/_fsdp_param.py). A storage
        not counted yet is counted as `kind` once it holds bytes; one resized to 0 stays known at
        0 bytes, so its next re-allocation is counted again."""
        for t in _dense_parts(tensors):
            if not self.active:
                return
            st = t.untyped_storage()
            key, nbytes = id(st), st.nbytes()
            with self._lock:
                entry = self._entries.get(key)
                if entry is None:
                    if nbytes == 0:
                        continue
                    ref = weakref.ref(st, lambda _r, key=key: self._free(key))
                    self._entries[key] = (self.device, kind, nbytes, ref, now())
                    self._change(self.device, kind, nbytes)
                elif entry[2] != nbytes:
                    dev, old_kind, old_bytes, ref, born = entry
                    self._entries[key] = (dev, old_kind, nbytes, ref, now() if nbytes else born)
                    self._change(dev, old_kind, nbytes - old_bytes)

    def kind_of(self, t: torch.Tensor) -> str | None:
        """The kind `t`'s storage is counted as, or None when it is not counted."""
        parts = _dense_parts([t])
        entry = self._entries.get(id(parts[-1].untyped_storage())) if parts else None
        return entry[1] if entry is not None else None

    def add_held(self, nbytes: int, kind: str, device: int | None = None) -> None:
        """Count `nbytes` held by C++ code the dispatch mode cannot see (e.g. DDP's reducer's bucket
        buffers with no comm hook), alive for the whole window."""
        if nbytes > 0 and self.active:
            with self._lock:
                self._change(self.device() if device is None else device, kind, int(nbytes))

    def _free(self, key: int) -> None:
        with self._lock:
            entry = self._entries.pop(key, None)
            if entry is not None:
                self._change(entry[0], entry[1], -entry[2])

    def _change(self, dev: int, kind: str, delta: int) -> None:
        self.totals[dev] += delta
        self.kinds[dev][kind] += delta
        t = now()
        self.points[dev].append((t, self.totals[dev]))
        if self.totals[dev] > self.peaks[dev]:
            self.peaks[dev], self.peak_t[dev] = self.totals[dev], t
            self.peak_kinds[dev] = {k: v for k, v in self.kinds[dev].items() if v}

    def breakdown(self, device: int) -> dict[str, int]:
        """Bytes by kind live now on `device` (kinds with 0 bytes left out)."""
        with self._lock:
            return {k: int(v) for k, v in self.kinds[device].items() if v}


class LedgerMode(TorchDispatchMode):
    """Counts every op's output storages in `ledger` while entered (one instance per thread).

    Args:
        ledger: where to count.
        device: the device this thread works for (None: keep the thread's current one).
    """

    def __init__(self, ledger: TensorLedger, device: int | None = None):
        super().__init__()
        self.ledger, self.dev = ledger, device
        self._ctx: Any = None

    def __enter__(self):
        self._ctx = self.ledger.working_for(self.dev)
        self._ctx.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._ctx.__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        add = self.ledger.add
        if isinstance(out, torch.Tensor):  # most ops: one tensor or a flat tuple, counted without a pytree walk
            add(out)
        elif out.__class__ in (tuple, list) and all(o is None or isinstance(o, torch.Tensor) for o in out):
            for o in out:
                if o is not None:
                    add(o)
        else:
            tree_map_only(torch.Tensor, add, out)
        return out


def _dense_parts(tensors: Iterable[torch.Tensor | None]) -> list[torch.Tensor]:
    """`tensors` without None, a sparse COO tensor replaced by its indices and values, a wrapper
    subclass (a DTensor: FSDP2's sharded parameters, their gradients and optimizer state) by the
    plain tensors it holds (`__tensor_flatten__`; a DTensor's local shard)."""
    out: list[torch.Tensor] = []
    for t in tensors:
        if t is None:
            continue
        if t.layout == torch.sparse_coo:
            out += [t._indices(), t._values()]
        elif is_traceable_wrapper_subclass(t):
            names, _ = t.__tensor_flatten__()
            out += _dense_parts(v for v in (getattr(t, n) for n in names) if isinstance(v, torch.Tensor))
        else:
            out.append(t)
    return out


def storage_nbytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes of the distinct storages behind `tensors` (a view or a shared storage counts once)."""
    seen: dict[int, int] = {}
    for t in _dense_parts(tensors):
        st = t.untyped_storage()
        seen[id(st)] = st.nbytes()
    return sum(seen.values())
