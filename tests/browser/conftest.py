"""Fixtures of the browser tests: Debian's Chromium through Playwright, the built site, an offline site page."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

playwright_sync = pytest.importorskip("playwright.sync_api", reason="make browser-test installs playwright")

from browser_support import CHROMIUM, CHROMIUM_ARGS, OUTPUT, ROOT, SITE, offline_context  # noqa: E402


@pytest.fixture(scope="session")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} not found: apt-get install -y chromium (never `playwright install`)")
    with playwright_sync.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="session")
def site():
    """site/, built by `make site` (here when it is missing)."""
    if not (SITE / "index.html").exists():
        subprocess.run([sys.executable, str(ROOT / "site_src" / "course_site.py")], check=True, cwd=ROOT)
    OUTPUT.mkdir(parents=True, exist_ok=True)
    return SITE


@pytest.fixture
def site_page(browser, site):
    """A page offline (file:// only) that records console errors and network requests; checked after the test."""
    context, blocked = offline_context(browser, ("file://",))
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    yield page
    context.close()
    assert not blocked, f"the site fetched from the network: {blocked[:5]}"
    assert not errors, f"console errors: {errors[:5]}"
