"""Pure transforms for the Learn page: who talks to whom, with the bytes each link carried.

From a run's `comm_volume` events of its latest step:

- DP (star): device 0 is the hub. Device i > 0 exchanges data only with device 0 (weights
  broadcast and inputs scattered to it; outputs gathered and gradients reduced from it), so
  the link 0–i carries device i's sent + received bytes.
- DDP (ring all-reduce): rank i sends to rank i+1 (mod n) and receives from rank i−1; each
  link i→i+1 carries rank i's sent bytes, 2(n−1)/n · P per step.

Nodes sit on a unit circle (the DP hub in the centre), so the chart needs no layout engine.

`theory_star`, `theory_ring`, `theory_tree`: the same three patterns (the tree is one of NCCL's
two binary trees) at a chosen world size, their links' bytes scaled from the run's gradient bytes
by each pattern's formula (theory); `allreduce_time_frame` the ring and tree time models.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import pandas as pd

from ddpviz.app.frames import base as frames

NODE_COLUMNS = ["node", "label", "role", "x", "y"]
EDGE_COLUMNS = ["link", "x", "y", "x2", "y2", "mx", "my", "ax", "ay", "lx", "ly", "mib", "label",
                "angle"]
_LABEL_GAP = 0.2  # a link's label sits this far to the right of its middle (unit-circle units)
ROLES = ["hub (device 0)", "replica (device 1..n−1)", "rank"]
_PAIR_OFFSET = 0.07  # two ranks: draw 0→1 and 1→0 side by side, not on top of each other


def latest_volume(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The latest `comm_volume` event of each rank and device, in that order (`frames.latest_volumes`)."""
    return frames.latest_volumes(events)


def _circle(n: int, i: int) -> tuple[float, float]:
    a = math.pi / 2 - 2 * math.pi * i / max(n, 1)  # first node on top, clockwise
    return math.cos(a), math.sin(a)


def star(volume: list[dict[str, Any]]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """DP's star: nodes (hub in the centre) and one edge per device i > 0."""
    if not volume:
        return pd.DataFrame(columns=NODE_COLUMNS), pd.DataFrame(columns=EDGE_COLUMNS)
    devices = [str(e.get("device")) for e in volume]
    others = devices[1:]
    nodes = [{"node": devices[0], "label": devices[0], "role": ROLES[0], "x": 0.0, "y": 0.0}]
    edges = []
    for i, (dev, e) in enumerate(zip(others, volume[1:])):
        x, y = _circle(len(others), i)
        nodes.append({"node": dev, "label": dev, "role": ROLES[1], "x": x, "y": y})
        mib = ((e.get("sent_bytes") or 0) + (e.get("recv_bytes") or 0)) / frames.MIB
        edges.append(_edge(f"{devices[0]} ↔ {dev}", (0.0, 0.0), (x, y), mib, 0.0))
    return pd.DataFrame(nodes, columns=NODE_COLUMNS), pd.DataFrame(edges, columns=EDGE_COLUMNS)


def ring(volume: list[dict[str, Any]], names: dict[int, str] | None = None
         ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """DDP's ring: a node per rank on the circle, a directed edge rank i → rank i+1."""
    if not volume:
        return pd.DataFrame(columns=NODE_COLUMNS), pd.DataFrame(columns=EDGE_COLUMNS)
    names = names or {}
    n = len(volume)
    pos = [_circle(n, i) for i in range(n)]
    nodes = [{"node": f"rank {e.get('rank', i)}", "label": names.get(e.get("rank", i),
                                                                     f"rank {e.get('rank', i)}"),
              "role": ROLES[2], "x": pos[i][0], "y": pos[i][1]} for i, e in enumerate(volume)]
    edges = []
    if n > 1:
        for i, e in enumerate(volume):
            j = (i + 1) % n
            mib = (e.get("sent_bytes") or 0) / frames.MIB
            edges.append(_edge(f"rank {i} → rank {j}", pos[i], pos[j], mib,
                               _PAIR_OFFSET if n == 2 else 0.0))
    return pd.DataFrame(nodes, columns=NODE_COLUMNS), pd.DataFrame(edges, columns=EDGE_COLUMNS)


def _edge(link: str, a: tuple[float, float], b: tuple[float, float], mib: float,
          offset: float) -> dict[str, Any]:
    """An edge from a to b, shifted `offset` to its right (so a→b and b→a do not overlap), with
    its midpoint, a point 70% along (arrow head), a label spot to its right and the bearing
    (degrees clockwise from up) of its direction."""
    dx, dy = b[0] - a[0], b[1] - a[1]
    length = math.hypot(dx, dy) or 1.0
    rx, ry = dy / length, -dx / length  # unit vector to the right of a→b
    ox, oy = rx * offset, ry * offset
    x, y, x2, y2 = a[0] + ox, a[1] + oy, b[0] + ox, b[1] + oy
    return {"link": link, "x": x, "y": y, "x2": x2, "y2": y2,
            "mx": x + 0.5 * (x2 - x), "my": y + 0.5 * (y2 - y),
            "ax": x + 0.7 * (x2 - x), "ay": y + 0.7 * (y2 - y),
            "lx": x + 0.5 * (x2 - x) + rx * _LABEL_GAP, "ly": y + 0.5 * (y2 - y) + ry * _LABEL_GAP,
            "mib": mib,
            "label": f"{mib:.2f} MiB", "angle": math.degrees(math.atan2(dx, dy)) % 360}


# -- theory at a chosen world size: star, ring and tree side by side ------------------------------

THEORY_NOTE = ("theory: the run's gradient bytes P scaled to n devices by each pattern's formula, "
               "not measured")


def theory_star(n: int, p_bytes: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """DP's star at n devices: each link 0–i carries P down (broadcast) and P up (reduce) per
    step, 2·P (the batch's scatter and gather left out: they depend on the batch, not on n)."""
    nodes = [{"node": "device 0", "label": "0", "role": ROLES[0], "x": 0.0, "y": 0.0}]
    edges = []
    for i in range(1, n):
        x, y = _circle(n - 1, i - 1)
        nodes.append({"node": f"device {i}", "label": str(i), "role": ROLES[1], "x": x, "y": y})
        edges.append(_edge(f"device 0 ↔ device {i}", (0.0, 0.0), (x, y), 2 * p_bytes / frames.MIB, 0.0))
    return pd.DataFrame(nodes, columns=NODE_COLUMNS), pd.DataFrame(edges, columns=EDGE_COLUMNS)


def theory_ring(n: int, p_bytes: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A ring all-reduce at n ranks: each link i → i+1 carries 2(n−1)/n·P per step."""
    pos = [_circle(n, i) for i in range(n)]
    nodes = [{"node": f"rank {i}", "label": str(i), "role": ROLES[2], "x": x, "y": y}
             for i, (x, y) in enumerate(pos)]
    mib = 2 * (n - 1) / n * p_bytes / frames.MIB
    edges = [_edge(f"rank {i} → rank {(i + 1) % n}", pos[i], pos[(i + 1) % n], mib,
                   _PAIR_OFFSET if n == 2 else 0.0) for i in range(n)] if n > 1 else []
    return pd.DataFrame(nodes, columns=NODE_COLUMNS), pd.DataFrame(edges, columns=EDGE_COLUMNS)


def tree_levels(n: int) -> int:
    """Levels of a binary tree of n ranks in heap order (rank i's parent is (i − 1) // 2):
    ⌈log2(n + 1)⌉; a chunk crosses levels − 1 ≈ log2 n links each way."""
    return max(1, math.ceil(math.log2(n + 1)))


def theory_tree(n: int, p_bytes: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One of NCCL's two binary trees at n ranks (heap order, root on top): each link carries
    the tree's half of P up (reduce) and down (broadcast), P per step; the second tree, with the
    leaves and inner ranks swapped, carries the other half over other links."""
    levels = tree_levels(n)
    pos = []
    for i in range(n):
        level = int(math.floor(math.log2(i + 1)))
        k, width = i - (2 ** level - 1), 2 ** level
        pos.append((-1.2 + 2.4 * (k + 0.5) / width, 1.15 - 2.3 * level / max(levels - 1, 1)))
    nodes = [{"node": f"rank {i}", "label": str(i), "role": ROLES[2], "x": x, "y": y}
             for i, (x, y) in enumerate(pos)]
    edges = [_edge(f"rank {(i - 1) // 2} ↔ rank {i}", pos[(i - 1) // 2], pos[i], p_bytes / frames.MIB, 0.0)
             for i in range(1, n)]
    return pd.DataFrame(nodes, columns=NODE_COLUMNS), pd.DataFrame(edges, columns=EDGE_COLUMNS)


def latency_steps(n: int) -> dict[str, int]:
    """Sequential link steps one all-reduce takes at n ranks (the α terms of the models in
    `engine.predict.step_models`): ring 2(n−1), tree 2·⌈log2 n⌉, DP's hub n−1 copies each way."""
    return {"ring": 2 * (n - 1), "tree": 2 * math.ceil(math.log2(n)) if n > 1 else 0,
            "star": 2 * (n - 1)}


def allreduce_time_frame(p_bytes: float, alpha_s: float, beta_bytes_per_s: float,
                         world_sizes: Iterable[int], models: dict[str, Any]) -> pd.DataFrame:
    """Columns world_size, model (a key of `models`), time_ms: one all-reduce of P by each model
    (`engine.predict.step_models.ALLREDUCE_MODELS`, passed in: frames import no engine module
    beyond the app's list; `fn(nbytes, n, alpha_s, beta_bytes_per_s)` seconds, theory) at each
    world size."""
    rows = [{"world_size": n, "model": algo, "time_ms": 1e3 * fn(p_bytes, n, alpha_s, beta_bytes_per_s)}
            for n in world_sizes for algo, fn in models.items()]
    return pd.DataFrame(rows, columns=["world_size", "model", "time_ms"])
