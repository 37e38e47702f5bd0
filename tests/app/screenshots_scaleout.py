"""Screenshots of the Scale-out page on runs of the default demo config:
``OMP_NUM_THREADS=1 .venv/bin/python tests/app/screenshots_scaleout.py``.

Starts the stack (embedded Redis, one worker, Streamlit), runs the default Launch config (mlp
128x3 on the digits, world size 2, batch 64) as a single/DP/DDP trio and as a world-size sweep
over 1 and 4 devices (measured points beside the prediction), prints `ddpviz predict --json`'s
validation, and writes docs/screenshots/scaleout.png (this machine) and scaleout-h100.png
(NVLink 4 and an H100 compute preset, 8 GPUs per host, InfiniBand between hosts).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from screenshots import OUT, VIEW, _settle, shoot, wait  # noqa: E402
from stack import AppStack, launch_browser  # noqa: E402

CONFIG = {"steps": 60, "step_delay_s": 0.0, "eval_every": 0}  # the Launch defaults otherwise


def main() -> None:
    from playwright.sync_api import sync_playwright

    from ddpviz.workers.client import DdpvizClient
    from ddpviz.workers.sweeps import submit_sweep, submit_trio, sweep_runs

    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, AppStack(Path(tmp)) as stack, sync_playwright() as pw:
        client = DdpvizClient(url=stack.redis_url)
        _, ids = submit_trio(client, CONFIG)
        sweep = submit_sweep(client, CONFIG, "world_size", [1, 4])
        wait(client, list(ids.values()) + [r["run_id"] for r in sweep_runs(client, sweep)], timeout_s=900)
        out = subprocess.run([str(Path(sys.executable).parent / "ddpviz"), "predict", ids["ddp"], "--json",
                              "--world-sizes", "1,2,3,4"], capture_output=True, text=True,
                             env={"REDIS_URL": stack.redis_url, "PATH": "/usr/bin:/bin"}, check=True)
        for v in json.loads(out.stdout)["validation"]:
            print(f"{v['mode']} n={v['world_size']}: measured {v['measured_samples_per_s']:.0f}/s, "
                  f"predicted {v['predicted_samples_per_s']:.0f}/s, {v['samples_per_s_error_pct']:+.1f}%")
        browser = launch_browser(pw)
        page = browser.new_page(viewport=VIEW)
        page.goto(f"{stack.url}/scaleout?run={ids['ddp']}&link=this-machine")  # it opens on PCIe
        page.get_by_role("heading", name="Scale-out").wait_for()
        _settle(page, charts=4)
        shoot(page, "scaleout")
        page.goto(f"{stack.url}/scaleout?run={ids['ddp']}&link=nvlink-h100&compute=h100")
        page.get_by_role("heading", name="Scale-out").wait_for()
        _settle(page, charts=4)
        shoot(page, "scaleout-h100")
        browser.close()


if __name__ == "__main__":
    main()
