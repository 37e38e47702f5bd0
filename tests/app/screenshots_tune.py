"""A screenshot of the Tune page on a recorded real `ddpviz tune` (no training):
``.venv/bin/python tests/app/screenshots_tune.py [OUT]``.

Starts the stack, stores the recorded search (`recorded.play_tune`: tune of
tests/workers/tune_script/train_tiny.py, 2 ranks, gloo, a candidate bucket cap against the
script's own) in its Redis and writes OUT/tune.png: the answer, the trials table, the ratio chart
and round 1's baseline beside its candidate. OUT defaults to docs/screenshots.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from screenshots_recorded import VIEW, shoot  # noqa: E402
from stack import ROOT, AppStack, launch_browser  # noqa: E402


def main(out: Path) -> None:
    from playwright.sync_api import sync_playwright
    from recorded import play_tune

    from ddpviz.workers.client import DdpvizClient

    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, AppStack(Path(tmp)) as stack, sync_playwright() as pw:
        play_tune(DdpvizClient(url=stack.redis_url), Path(tmp) / "spools")
        page = launch_browser(pw).new_page(viewport=VIEW)
        shoot(page, out, "tune", f"{stack.url}/tune", "Tune", 3)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "screenshots")
