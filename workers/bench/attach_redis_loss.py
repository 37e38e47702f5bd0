"""Figure 9, second part: an attached script whose Redis stops mid-run (issue 24's fail-open rule).

The same unmodified script (examples/attach/train_regression.py on 2 gloo ranks) runs under
``ddpviz run -- torchrun ...``, taking turns in each round: once with its Redis up the whole run,
once with its Redis stopped as soon as the run's first step event is stored there. Each turn has
its own private Redis (`workers.connection.EmbeddedRedis`). Measured per turn: the wall time of
the whole `ddpviz run` command (start to exit, by this process's `time.perf_counter()`), and its
exit code (the script's, passed through: it must be 0). After a stopped turn, Redis is started
again on its data and `ddpviz upload SPOOL` sends what the launcher kept; the run must then hold
every step the script counted itself (``TRAIN_REPORT``), on each rank, once.

Target (issue 24): median wall time with Redis stopped / with Redis up <= 1.10, every step kept.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ddpviz.workers.bench.attach_cost import EXAMPLE, _cmd, bench_env, run_id_in

TARGET = 1.10
FIRST_STEP_TIMEOUT_S = 240


def _script_steps(report: Path, nproc: int = 2) -> list[int]:
    return [json.loads(Path(str(report).replace(".json", f".rank{r}.json")).read_text())["steps"]
            for r in range(nproc)]


def _stored_steps(url: str, run_id: str) -> list[list[int]]:
    from ddpviz.workers.client import DdpvizClient
    from ddpviz.workers.connection import connect
    from ddpviz.workers.history import read_all_events

    client = DdpvizClient(redis=connect(url))
    events = read_all_events(client, run_id)
    return [sorted(e["step"] for e in events if e["type"] == "step" and e.get("rank") == r) for r in range(2)]


def _turn(stop_redis: bool, work: Path, epochs: int, hidden: int, i: int) -> dict[str, Any]:
    """One attached run on its own Redis; with `stop_redis`, Redis stops after the first stored step."""
    from ddpviz.workers.client import DdpvizClient
    from ddpviz.workers.connection import EmbeddedRedis

    tmp = work / f"redis-loss-{i}"
    server = EmbeddedRedis(tmp / "redis").start()
    spool, report = tmp / "spool", tmp / "report.json"
    env = {**bench_env(), "TRAIN_REPORT": str(report)}
    cmd = [sys.executable, "-m", "ddpviz.workers", "run", "--url", server.url, "--spool", str(spool), "--",
           *_cmd(epochs, hidden, 0.25)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        run_id = None
        while run_id is None:
            line = proc.stderr.readline()
            if not line:
                raise RuntimeError(f"turn {i}: `ddpviz run` ended before printing its run id")
            run_id = run_id_in(line)
        stopped_after_s = None
        if stop_redis:
            client = DdpvizClient(url=server.url)
            deadline = time.monotonic() + FIRST_STEP_TIMEOUT_S
            while not any(e["type"] == "step" for e in client.tail_events(run_id, 20)):
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"turn {i}: no step stored in Redis")
                time.sleep(0.05)
            server.stop()
            stopped_after_s = round(time.perf_counter() - t0, 3)
        _, err = proc.communicate(timeout=900)
        wall_s = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"turn {i} (Redis {'stopped' if stop_redis else 'up'}) exited "
                               f"{proc.returncode}: {err[-2000:]}")
        if stop_redis:
            server = EmbeddedRedis(server.data_dir, port=server.port).start()
            up = subprocess.run([sys.executable, "-m", "ddpviz.workers", "upload", str(spool), "--url", server.url],
                                env=env, capture_output=True, text=True, timeout=300)
            if up.returncode != 0:
                raise RuntimeError(f"turn {i}: ddpviz upload exited {up.returncode}: {up.stderr[-2000:]}")
        script = _script_steps(report)
        stored = _stored_steps(server.url, run_id)
        complete = all(stored[r] == list(range(script[r])) for r in range(2))
        return {"redis": "stopped" if stop_redis else "up", "wall_s": round(wall_s, 3), "run_id": run_id,
                "stopped_after_s": stopped_after_s, "script_steps": script,
                "stored_steps": [len(s) for s in stored], "every_step_once": complete}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        server.stop()


def measure_redis_loss(work: Path, rounds: int = 3, epochs: int = 6, hidden: int = 1024) -> dict[str, Any]:
    """The figure (module docstring): rounds of one Redis-up and one Redis-stopped turn, taking
    turns (up first in even rounds). Returns medians, the ratio, per-turn records and `met`.

    Raises:
        RuntimeError: a turn's command failed, printed no run id, or stored no step.
    """
    if not EXAMPLE.is_file():
        return {"reason": f"{EXAMPLE} is not here (an installed package without examples/)"}
    turns = []
    for r in range(rounds):
        for stop in ((False, True) if r % 2 == 0 else (True, False)):
            turns.append(_turn(stop, work, epochs, hidden, len(turns)))
    up = [t["wall_s"] for t in turns if t["redis"] == "up"]
    down = [t["wall_s"] for t in turns if t["redis"] == "stopped"]
    ratio = statistics.median(down) / statistics.median(up)
    complete = all(t["every_step_once"] for t in turns)
    return {"script": "examples/attach/train_regression.py", "hidden": hidden, "epochs": epochs,
            "bucket_cap_mb": 0.25, "rounds": rounds,
            "source": "measured: wall time of the whole `ddpviz run -- torchrun ...` command, start to exit",
            "median_wall_up_s": round(statistics.median(up), 3),
            "median_wall_stopped_s": round(statistics.median(down), 3),
            "ratio": round(ratio, 4), "target": TARGET, "every_step_kept": complete,
            "met": ratio <= TARGET and complete, "turns": turns}
