"""Screenshots for `ddpviz doctor --gpu`: the Live and Bucket timeline pages of the doctor's GPU runs.

Starts the Streamlit app (`ddpviz up`'s command line) on a free loopback port against the
doctor's private Redis, drives headless Chromium with Playwright (its own browser, else Debian's
/usr/bin/chromium), writes DIR/live.png and DIR/buckets.png, and stops the app. Without
Streamlit, Playwright or a Chromium the check is skipped, saying which is missing.
"""

from __future__ import annotations

import importlib.util
import os
import time
import urllib.request
from pathlib import Path
from typing import Any

from ddpviz.workers.doctor.report import CheckSkipped

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
APP_START_TIMEOUT_S = 60.0
VIEW = {"width": 1500, "height": 1000}
MAX_HEIGHT_PX = 4000


def _launch(pw):
    try:
        return pw.chromium.launch(args=CHROMIUM_ARGS)  # Playwright's own browser, if installed
    except Exception as first:
        if not Path(CHROMIUM).exists():
            raise CheckSkipped(f"no Chromium: Playwright's browser is not installed ({str(first)[:120]}) "
                               f"and {CHROMIUM} does not exist") from None
        return pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


def _start_app(stack) -> tuple[Any, str]:
    from ddpviz.workers.connection import ENV_VAR, free_port
    from ddpviz.workers.host.procs import UP_TOKEN_ENV, Child
    from ddpviz.workers.up import app_command, default_app_path

    port = free_port()
    env = {**os.environ, ENV_VAR: stack.url, UP_TOKEN_ENV: stack.token, "PYTHONUNBUFFERED": "1"}
    argv = app_command(default_app_path(), "127.0.0.1", port) + ["--server.fileWatcherType", "none"]
    app = Child("app", argv, env, log_path=str(stack.workdir / "app.log")).start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + APP_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if not app.running():
            raise RuntimeError(f"the app exited with code {app.proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return app, url
        except OSError:
            time.sleep(0.3)
    app.stop()
    raise RuntimeError(f"the app did not answer within {APP_START_TIMEOUT_S:g} s")


def _shoot(page, url: str, heading: str, path: Path, charts: int) -> Path:
    page.goto(url)
    page.get_by_role("heading", name=heading).wait_for(timeout=60_000)
    page.locator(".vega-embed canvas, .vega-embed svg").nth(charts - 1).wait_for(timeout=60_000)
    page.wait_for_timeout(1500)
    # Streamlit scrolls inside its own container: make the viewport as tall as the page
    height = page.evaluate("() => document.querySelector('[data-testid=\"stMain\"]').scrollHeight") + 40
    page.set_viewport_size({"width": VIEW["width"], "height": min(MAX_HEIGHT_PX, height)})
    page.wait_for_timeout(1500)
    page.screenshot(path=str(path))
    page.set_viewport_size(VIEW)
    return path


def take_screenshots(stack, runs: dict[str, str], out_dir: Path) -> list[Path]:
    """Live (DP and DDP side by side) and Bucket timeline (DDP) as PNGs in `out_dir`.

    Raises:
        CheckSkipped: Streamlit, Playwright or a Chromium is missing.
    """
    missing = [m for m in ("streamlit", "playwright") if importlib.util.find_spec(m) is None]
    if missing:
        raise CheckSkipped(f"{' and '.join(missing)} not installed (pip install -e '.[dev]')")
    from playwright.sync_api import sync_playwright

    out_dir.mkdir(parents=True, exist_ok=True)
    app, url = _start_app(stack)
    try:
        with sync_playwright() as pw:
            browser = _launch(pw)
            try:
                page = browser.new_page(viewport=VIEW)
                return [_shoot(page, f"{url}/live?runs={runs['dp']},{runs['ddp']}", "Live", out_dir / "live.png", 3),
                        _shoot(page, f"{url}/buckets?runs={runs['ddp']}", "Bucket timeline",
                               out_dir / "buckets.png", 2)]
            finally:
                browser.close()
    finally:
        app.stop()
