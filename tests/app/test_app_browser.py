"""End to end in headless Chromium: launch a real DDP run from the Launch page, watch it on Live.

Starts an embedded Redis, `ddpviz worker` and `streamlit run app/main.py` as subprocesses.
"""

from pathlib import Path

import pytest
from stack import CHROMIUM, AppStack, launch_browser

pytestmark = [pytest.mark.browser, pytest.mark.slow]

RUN_TIMEOUT_MS = 180_000  # worker start, rank spawn and 20 steps on a 2-core CI box


def _fill(page, field: str, value: str) -> None:
    box = page.locator(f'input[aria-label="{field}"]')
    box.fill(value)
    box.press("Tab")  # Streamlit commits a number input on blur


def _no_exceptions(page) -> None:
    assert page.locator('[data-testid="stException"]').count() == 0


def test_launch_ddp_and_watch_it_finish(tmp_path):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with AppStack(tmp_path) as stack, sync_api.sync_playwright() as pw:
        browser = launch_browser(pw)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            page.goto(stack.url)
            page.get_by_role("heading", name="Launch a run").wait_for(timeout=30_000)
            page.get_by_role("radio", name="one run", exact=True).click()  # "What to launch"
            page.get_by_role("button", name="Launch one run", exact=True).wait_for(timeout=30_000)
            _fill(page, "steps", "20")
            _fill(page, "bucket_cap_mb", "0.05")  # several buckets even for the small mlp
            _fill(page, "step_delay_s", "0.05")  # long enough to be watched live
            page.get_by_role("button", name="Launch one run", exact=True).click()
            page.get_by_role("link", name="Watch them live").click()
            page.get_by_role("heading", name="Live").wait_for(timeout=30_000)
            try:
                page.get_by_text("step 20 / 20").wait_for(timeout=RUN_TIMEOUT_MS)
                page.get_by_text("succeeded").first.wait_for(timeout=30_000)  # the status badge
            except Exception:
                page.screenshot(path=str(tmp_path / "live-timeout.png"), full_page=True)
                raise AssertionError(f"run did not finish; worker log:\n{stack.log('worker')}")
            charts = page.locator(".vega-embed canvas, .vega-embed svg")
            charts.nth(4).wait_for(timeout=30_000)  # throughput, split, memory, buckets, volume
            _no_exceptions(page)
            page.get_by_role("link", name="Runs").click()
            page.get_by_role("heading", name="Runs").wait_for(timeout=30_000)
            page.locator('[data-testid="stDataFrame"]').wait_for(timeout=30_000)
            _no_exceptions(page)
        finally:
            browser.close()
