"""Screenshots of the measured memory chart and Compare on the wide-logits pair:
``OMP_NUM_THREADS=1 .venv/bin/python tests/app/screenshots_memory.py``.

Registers the test models of tests/engine/memory_models.py as plugins (a dist-info in a temporary
folder put on PYTHONPATH, which the stack's worker and its rank processes inherit), starts the
stack, runs a single/DP/DDP trio of `widelogits` (Linear 64 -> 20,000 logits, global batch 64)
and one of `bnmlp` (BatchNorm buffers), and writes docs/screenshots/memory-live.png (Live,
DP beside DDP), memory-compare.png (Compare, the trio) and memory-buffers.png (Compare of the BatchNorm trio,
with DDP's buffers per rank).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

from screenshots import OUT, VIEW, _settle, shoot, visit, wait  # noqa: E402
from stack import ROOT, AppStack, launch_browser  # noqa: E402

CONFIG = {"model": "widelogits", "world_size": 2, "global_batch_size": 64, "steps": 30,
          "step_delay_s": 0.05, "eval_every": 10}


def main() -> None:
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "site"
        engine_tests = ROOT / "tests" / "engine"
        sys.path[:0] = [str(site), str(engine_tests)]
        import memory_models

        memory_models.installed(site)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [str(site), str(engine_tests), os.environ.get("PYTHONPATH", "")])
        from ddpviz.workers.client import DdpvizClient
        from ddpviz.workers.sweeps import submit_trio

        OUT.mkdir(parents=True, exist_ok=True)
        with AppStack(Path(tmp) / "stack") as stack, sync_playwright() as pw:
            browser = launch_browser(pw)
            page = browser.new_page(viewport=VIEW)
            client = DdpvizClient(url=stack.redis_url)
            _, ids = submit_trio(client, CONFIG)
            _, bn = submit_trio(client, {**CONFIG, "model": "bnmlp", "eval_every": 5})
            wait(client, list(ids.values()) + list(bn.values()), timeout_s=900)
            time.sleep(1)
            page.goto(f"{stack.url}/live?runs={ids['dp']},{ids['ddp']}")
            page.get_by_role("heading", name="Live").wait_for()
            _settle(page, charts=6)
            shoot(page, "memory-live")
            visit(page, f"{stack.url}/compare?runs={','.join(ids.values())}", "Compare", 6,
                  "memory-compare")
            visit(page, f"{stack.url}/compare?runs={','.join(bn.values())}", "Compare", 6,
                  "memory-buffers")
            browser.close()


if __name__ == "__main__":
    main()
