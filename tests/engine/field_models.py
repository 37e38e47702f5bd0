"""Models from public DP/DDP bug reports, as ddpviz plugins (issue "Cases from the field").

`install(root)` registers them under the `ddpviz.models` entry-point group the way `pip install`
does (a `*.dist-info` with `entry_points.txt` on sys.path); rank processes started with `spawn`
inherit sys.path, so they find them too.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn as nn

from ddpviz.engine.data import Dataset, load_dataset
from ddpviz.engine.plugins import ModelPlugin

HERE = Path(__file__).resolve().parent


def digits(cfg):
    return load_dataset(cfg.model_copy(update={"model": "mlp", "dataset": "digits"}))


def random_data(name: str, features: int, classes: int, n: int = 512, long_x: int | None = None) -> Dataset:
    """Seeded random data: x (n, features) floats (or (n,) ids below `long_x`), y (n,) in [0, classes)."""
    g = torch.Generator().manual_seed(7)
    x = (torch.randint(0, long_x, (n,), generator=g) if long_x
         else torch.randn(n, features, generator=g))
    y = torch.randint(0, classes, (n,), generator=g)
    cut = n * 3 // 4
    return Dataset(name, x[:cut], y[:cut], x[cut:], y[cut:], in_dim=features, n_classes=classes)


class TwoHeads(nn.Module):
    """Case 1: forward computes both heads and returns only the first (head_b never gets a grad)."""

    def __init__(self):
        super().__init__()
        self.body = nn.Linear(64, 32)
        self.head_a, self.head_b = nn.Linear(32, 10), nn.Linear(32, 10)

    def forward(self, x):
        h = torch.relu(self.body(x))
        a, _b = self.head_a(h), self.head_b(h)
        return a


class BatchNormHalves(nn.Module):
    """Case 2: splits its batch in two and applies BatchNorm to each half."""

    def __init__(self):
        super().__init__()
        self.inp, self.bn, self.out = nn.Linear(16, 16), nn.BatchNorm1d(16), nn.Linear(16, 10)

    def forward(self, x):
        a, b = self.inp(x).chunk(2)
        return self.out(torch.cat([torch.relu(self.bn(a)), torch.relu(self.bn(b))]))


class Outputs(nn.Module):
    """Case 4: an MLP returning a dict with `logits`, or a tuple (logits, hidden)."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self.body, self.head = nn.Linear(64, 32), nn.Linear(32, 10)

    def forward(self, x):
        h = torch.relu(self.body(x))
        logits = self.head(h)
        if self.kind == "dict":
            return {"logits": logits, "hidden": h}
        if self.kind == "tuple":
            return logits, h
        return {"scores": logits}  # no logits where ddpviz looks


class SparseEmbedding(nn.Module):
    """Case 6: Embedding(10, 4, sparse=True) + Linear(4, 4); x (B,) ids -> (B, 4)."""

    def __init__(self):
        super().__init__()
        self.emb, self.lin = nn.Embedding(10, 4, sparse=True), nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(self.emb(x))


def _boom(cfg):
    raise RuntimeError("plugin build exploded on purpose")


def _no_data(cfg):
    raise FileNotFoundError("letters.npz: the plugin's data is missing")


# -- issue 25 ("turn 3") -----------------------------------------------------------------------------

BAD_STEP = 3  # the step whose global batch holds the bad sample
BAD_RANK = 1  # the rank (DDP, FSDP) whose shard holds it at that step


def bad_sample_data(cfg, kind: str, step: int = BAD_STEP) -> Dataset:
    """16 features, 10 classes; one training sample spoiled, the first that rank `BAD_RANK` trains
    on at `step` (`BAD_STEP` by default; by the run's own `BatchPlan`, so single, DP and DDP meet it there):
    NaN features (`kind="nan"`, the loss is NaN), or features ±3e38 with label 0 for `ScaledLogits`
    (`kind="inf"`, cross-entropy overflows float32 to inf)."""
    from ddpviz.engine.data import BatchPlan

    ds = random_data(f"bad-{kind}", 16, 10)
    plan = BatchPlan(len(ds), cfg.world_size, cfg.micro_batch_per_device, cfg.seed)
    i = int(plan.rank_indices(step * cfg.grad_accum_steps, min(BAD_RANK, cfg.world_size - 1))[0])
    if kind == "nan":
        ds.x_train[i] = float("nan")
    else:
        ds.x_train[i] = 0.0
        ds.x_train[i, 0], ds.x_train[i, 1], ds.y_train[i] = -3e38, 3e38, 0
    return ds


class ScaledLogits(nn.Module):
    """logits = x[:, :10] + Linear(16, 10)(x): a ±3e38 input reaches the logits (|Linear| < 1.5e38)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 10)

    def forward(self, x):
        return x[:, :10] + self.lin(x)


class HangsAt4(nn.Module):
    """A forward that never returns from its 4th training call on (every rank alike: no collective is left
    waiting, so no collective timeout ends the run): a stalled run."""

    def __init__(self):
        super().__init__()
        self.lin, self.calls = nn.Linear(64, 10), 0

    def forward(self, x):
        import time

        if self.training:
            self.calls += 1
            while self.calls >= 4:
                time.sleep(0.05)
        return self.lin(x)


class SleepInBackward(torch.autograd.Function):
    """Identity forward; its backward sleeps `seconds`, so the layers before it get their gradients late."""

    @staticmethod
    def forward(ctx, x, seconds):
        ctx.seconds = seconds
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        import time

        time.sleep(ctx.seconds)
        return grad, None


class Stamped(nn.Module):
    """Two layers, 4 ms of sleep in the forward and 6 ms in the backward between them (two buckets at
    bucket_cap_mb 0.002: 16,640 B and 2,600 B). Each parameter's post-accumulate-grad hook (PyTorch's, not the
    reducer's) appends "name wall_ts" to $DDPVIZ_TEST_STAMPS/rank$RANK.txt when that variable is set: an
    independent stamp of the moment each gradient was ready, on the clock `step` events place
    `backward_start_ts` on (`engine.measure.telemetry.wall_ts` of `time.perf_counter()`)."""

    def __init__(self):
        import os

        super().__init__()
        self.first, self.second = nn.Linear(64, 64), nn.Linear(64, 10)
        out = os.environ.get("DDPVIZ_TEST_STAMPS")
        if out:
            path = Path(out) / f"rank{os.environ.get('RANK', '0')}.txt"
            for name, p in self.named_parameters():
                p.register_post_accumulate_grad_hook(lambda p, n=name: _stamp(path, n))

    def forward(self, x):
        import time

        if self.training:
            time.sleep(0.004)
        return self.second(SleepInBackward.apply(torch.relu(self.first(x)), 0.006 if self.training else 0.0))


def _stamp(path: Path, name: str) -> None:
    import time

    from ddpviz.engine.measure.telemetry import wall_ts

    at = wall_ts(time.perf_counter())
    with open(path, "a") as f:
        f.write(f"{name} {at!r}\n")


def no_validation(cfg) -> Dataset:
    """Digits with an empty validation split (0 samples)."""
    ds = digits(cfg)
    return Dataset("digits-noval", ds.x_train, ds.y_train, ds.x_val[:0], ds.y_val[:0], ds.in_dim, ds.n_classes)


def compiled_mlp(cfg) -> nn.Module:
    """An MLP through `torch.compile` (eager backend: no compiler toolchain needed)."""
    return torch.compile(nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10)), backend="eager")


def big_inputs(cfg) -> Dataset:
    """Digits scaled by 1e7: gradients of ~1e6, finite in float32, beyond float16's 65504."""
    ds = digits(cfg)
    return Dataset("digits-1e7", ds.x_train * 1e7, ds.y_train, ds.x_val * 1e7, ds.y_val, ds.in_dim, ds.n_classes)


bigx = ModelPlugin(build=lambda cfg: nn.Linear(64, 10), dataset=big_inputs, description="inputs x 1e7")
nanat3 = ModelPlugin(build=lambda cfg: nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 10)),
                     dataset=lambda cfg: bad_sample_data(cfg, "nan"), description="a NaN sample at step 3")
nanat9 = ModelPlugin(build=lambda cfg: nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 10)),
                     dataset=lambda cfg: bad_sample_data(cfg, "nan", step=9),
                     description="a NaN sample at step 9 (a DDP rank's ordinary step)")
infat3 = ModelPlugin(build=lambda cfg: ScaledLogits(), dataset=lambda cfg: bad_sample_data(cfg, "inf"),
                     description="an overflowing sample at step 3")
hangat4 = ModelPlugin(build=lambda cfg: HangsAt4(), dataset=digits, description="a forward that never returns at step 3")
noval = ModelPlugin(build=lambda cfg: Outputs("tuple"), dataset=no_validation, description="no validation split")
compiled = ModelPlugin(build=compiled_mlp, dataset=digits, description="torch.compile'd MLP")
tiny3 = ModelPlugin(build=lambda cfg: nn.Linear(16, 10), dataset=lambda cfg: random_data("tiny3", 16, 10, n=4),
                    description="3 training samples")
dictbuild = ModelPlugin(build=lambda cfg: {"model": nn.Linear(64, 10)}, dataset=digits,
                        description="build() returns a dict")
twoheads = ModelPlugin(build=lambda cfg: TwoHeads(), dataset=digits, description="two heads, one returned")
bnhalves = ModelPlugin(build=lambda cfg: BatchNormHalves(),
                       dataset=lambda cfg: random_data("halves16", 16, 10), description="BatchNorm per half")
dictout = ModelPlugin(build=lambda cfg: Outputs("dict"), dataset=digits)
tupleout = ModelPlugin(build=lambda cfg: Outputs("tuple"), dataset=digits)
scoresout = ModelPlugin(build=lambda cfg: Outputs("scores"), dataset=digits)
letters27 = ModelPlugin(build=lambda cfg: nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 10)),
                        dataset=lambda cfg: random_data("letters27", 16, 27), description="27 classes, 10 outputs")
sparseemb = ModelPlugin(build=lambda cfg: SparseEmbedding(),
                        dataset=lambda cfg: random_data("ids10", 1, 4, long_x=10), description="sparse embedding")
boom = ModelPlugin(build=_boom, dataset=digits)
nodata = ModelPlugin(build=lambda cfg: TwoHeads(), dataset=_no_data)
stamped = ModelPlugin(build=lambda cfg: Stamped(), dataset=digits, description="gradient-ready stamps of its own")

NAMES = ("twoheads", "bnhalves", "dictout", "tupleout", "scoresout", "letters27", "sparseemb", "boom",
         "nodata", "nanat3", "nanat9", "infat3", "noval", "compiled", "tiny3", "dictbuild", "bigx", "hangat4",
         "stamped")


def install(root: Path) -> None:
    """Register every plugin above from a dist-info in `root` and put `root` and this folder on
    sys.path (first)."""
    dist = root / "ddpviz_field_cases-0.1.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ddpviz-field-cases\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[ddpviz.models]\n" + "".join(f"{n} = field_models:{n}\n" for n in NAMES))
    for path in (str(HERE), str(root)):
        if path not in sys.path:
            sys.path.insert(0, path)


def uninstall(root: Path) -> None:
    for path in (str(root),):
        if path in sys.path:
            sys.path.remove(path)
