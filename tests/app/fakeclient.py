"""An in-memory stand-in for `workers.client.DdpvizClient` (same method names and shapes).

Used by AppTests that must not depend on a worker; the real client is exercised against Redis
in the other AppTests and in the browser test.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from ddpviz.engine.config import validate_config


class FakeClient:
    """Runs and event streams in dicts; stream ids are ``"<n>-0"``."""

    def __init__(self, reachable: bool = True):
        self.reachable = reachable
        self.runs: dict[str, dict[str, Any]] = {}
        self.streams: dict[str, list[dict[str, Any]]] = {}
        self.submitted: list[dict[str, Any]] = []
        self.canceled: list[str] = []
        self.live_workers: list[dict[str, Any]] = [{"name": "fake-worker"}]  # [] : none alive

    def ping(self) -> bool:
        return self.reachable

    def workers(self) -> list[dict[str, Any]]:
        return self.live_workers

    def add_run(self, run_id: str, config: dict[str, Any], *, status: str = "queued",
                events: list[dict[str, Any]] | None = None, group: str | None = None,
                label: str | None = None, error: dict | None = None,
                summary: dict | None = None, created_at: float | None = None,
                started: dict | None = None) -> str:
        cfg = validate_config(config).to_json_dict()
        self.runs[run_id] = {"run_id": run_id, "status": status, "config": cfg,
                             "created_at": created_at or time.time(), "started_at": None,
                             "finished_at": None, "error": error, "summary": summary,
                             "worker": None, "group": group, "label": label, "started": started}
        self.streams[run_id] = list(events or [])
        return run_id

    def submit(self, config: dict[str, Any], *, label: str | None = None,
               group: str | None = None) -> str:
        validate_config(config)
        self.submitted.append(config)
        return self.add_run(uuid.uuid4().hex[:12], config, group=group, label=label)

    def submit_pair(self, config: dict[str, Any], *, label: str | None = None) -> tuple[str, str]:
        from ddpviz.workers.sweeps import member_label

        group = uuid.uuid4().hex[:8]
        return (self.submit({**config, "mode": "dp"}, group=group, label=member_label(label, "DP")),
                self.submit({**config, "mode": "ddp"}, group=group, label=member_label(label, "DDP")))

    def list_runs(self, limit: int = 100) -> list[dict[str, Any]]:
        runs = sorted(self.runs.values(), key=lambda r: r["created_at"], reverse=True)
        return runs[:limit]

    def get_run(self, run_id: str) -> dict[str, Any] | None:
        return self.runs.get(run_id)

    def read_events(self, run_id: str, after_id: str = "0-0", count: int = 2000
                    ) -> tuple[list[dict[str, Any]], str]:
        start = int(after_id.split("-")[0])
        evs = self.streams.get(run_id, [])[start:start + count]
        return evs, f"{start + len(evs)}-0"

    def tail_events(self, run_id: str, count: int) -> list[dict[str, Any]]:
        return self.streams.get(run_id, [])[-count:]

    def cancel(self, run_id: str) -> str:
        self.canceled.append(run_id)
        self.runs[run_id]["status"] = "canceled"
        return "canceled"
