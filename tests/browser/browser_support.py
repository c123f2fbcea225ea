"""What the browser tests share: the paths, the browser's settings, an offline context, site navigation.

Imported by conftest.py (the fixtures) and the test modules of tests/browser/.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# BROWSER_NOTEBOOKS_DIR: another folder of notebooks to run (e.g. to see the test fail on a broken one).
NOTEBOOK_DIR = Path(os.environ.get("BROWSER_NOTEBOOKS_DIR", ROOT / "notebooks"))
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
# One notebook of the Chinese edition as well (notebooks/zh/: the English code, generated): 06 reads data/,
# which its setup cell reaches by moving into notebooks/.
ZH_IN_LAB = [p for p in [NOTEBOOK_DIR / "zh" / "06_loading_across_devices.ipynb"] if p.is_file()]
OUTPUT = ROOT / "test-output" / "browser"
SITE = ROOT / "site"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1400, "height": 1000}


def offline_context(browser, allowed: tuple[str, ...]):
    """A browser context that blocks (and records) every request not starting with an allowed prefix."""
    context = browser.new_context(viewport=VIEWPORT)
    blocked: list[str] = []

    def route(r):
        if r.request.url.startswith(allowed) or r.request.url.startswith(("data:", "blob:")):
            r.continue_()
        else:
            blocked.append(r.request.url)
            r.abort()

    context.route("**/*", route)
    return context, blocked


def open_site(page, rel: str) -> None:
    page.goto((SITE / rel).resolve().as_uri())
    page.wait_for_load_state("load")


def search(page, term: str) -> list[str]:
    """Type the term into the search box (the one search button shown: the sidebar's, or at phone width the
    article header's); the result links on search.html."""
    page.locator(".search-button__button:visible").first.click()
    page.locator("input[name=q]:visible").fill(term)
    page.keyboard.press("Enter")
    page.wait_for_url("**/search.html?q=*")
    page.wait_for_selector("#search-results ul li a", timeout=15_000)
    return page.eval_on_selector_all("#search-results ul li a", "els => els.map(e => e.getAttribute('href'))")
