"""The Launch page's two choices in headless Chromium at laptop widths: every segment of "What to
launch" and "Preset" inside its control (issue 21: "one run" was cut off at 1280 px)."""

from __future__ import annotations

from pathlib import Path

import pytest
from stack import CHROMIUM, AppStack, launch_browser

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# each button of each segmented control: wider than its box, or past the control's edge
CLIPPED_JS = """() => [...document.querySelectorAll('[data-testid="stButtonGroup"]')].flatMap(g => {
  const edge = g.getBoundingClientRect();
  return [...g.querySelectorAll('button')].filter(b => {const r = b.getBoundingClientRect();
    return b.scrollWidth > b.clientWidth + 1 || r.right > edge.right + 1 || r.left < edge.left - 1;
  }).map(b => b.innerText)})"""


def test_launch_choices_are_never_cut(tmp_path):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with AppStack(tmp_path) as stack, sync_api.sync_playwright() as pw:
        browser = launch_browser(pw)
        try:
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
        finally:
            browser.close()
