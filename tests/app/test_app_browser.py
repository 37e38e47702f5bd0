"""End to end in headless Chromium: the Launch page's choices at laptop widths, then a real DDP
run launched from it and watched on Live.

One stack for the module: an embedded Redis, `ddpviz worker` and `streamlit run app/main.py` as
subprocesses.
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


# each button of each segmented control: wider than its box, or past the control's edge
CLIPPED_JS = """() => [...document.querySelectorAll('[data-testid="stButtonGroup"]')].flatMap(g => {
  const edge = g.getBoundingClientRect();
  return [...g.querySelectorAll('button')].filter(b => {const r = b.getBoundingClientRect();
    return b.scrollWidth > b.clientWidth + 1 || r.right > edge.right + 1 || r.left < edge.left - 1;
  }).map(b => b.innerText)})"""


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    """(stack, browser) shared by the module's tests."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with AppStack(tmp_path_factory.mktemp("browser")) as stack, sync_api.sync_playwright() as pw:
        browser = launch_browser(pw)
        try:
            yield stack, browser
        finally:
            browser.close()


def test_launch_choices_are_never_cut(app):
    """Every segment of "What to launch" and "Preset" inside its control at 1280 and 1024 px
    (issue 21: "one run" was cut off at 1280 px)."""
    stack, browser = app
    for width in (1280, 1024):
        page = browser.new_page(viewport={"width": width, "height": 900})
        page.goto(stack.url)
        page.get_by_role("heading", name="Launch a run").wait_for(timeout=30_000)
        one = page.get_by_role("radio", name="one run", exact=True)
        one.wait_for(timeout=30_000)
        page.wait_for_timeout(500)  # fonts and layout
        assert page.evaluate(CLIPPED_JS) == [], width
        one.click()  # reachable: the form turns to one run
        page.get_by_role("button", name="Launch one run", exact=True).wait_for(timeout=30_000)
        page.close()


def test_launch_ddp_and_watch_it_finish(app, tmp_path):
    stack, browser = app
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    try:
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
        page.close()
