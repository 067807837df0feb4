"""The demo's dashboard in a real browser (headless Chromium through Selenium) against a live demo server.

What a newcomer does on the page: press "Send 20 at once" and see 429s with their Retry-After; take the
partner down, send more, and see the breaker turn OPEN. Assertions read the page's visible text, not its
markup, so a redesign keeps the test meaningful.

Needs Debian's ``chromium`` and ``chromium-driver`` (``.ci/run`` installs them when missing) and the
``selenium`` package (the ``test`` extra). Skips without them, except under ``R4_REQUIRE_BROWSER=1`` (CI),
where a missing browser is a failure, like a missing Redis.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.test_demo_servers import needs_gunicorn, request, serve

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
CHROMEDRIVER = shutil.which("chromedriver")


def _browser_missing() -> str | None:
    if importlib.util.find_spec("selenium") is None:
        return "selenium not installed (pip install -e '.[test]')"
    if CHROMIUM is None or CHROMEDRIVER is None:
        return "no chromium + chromedriver (apt-get install chromium chromium-driver)"
    return None


@pytest.fixture
def browser() -> Iterator[Any]:
    """A headless Chromium driven by the system chromedriver (no download: Selenium Manager is not used)."""
    missing = _browser_missing()
    if missing:
        if os.environ.get("R4_REQUIRE_BROWSER") == "1":
            pytest.fail(f"a browser is required (R4_REQUIRE_BROWSER=1): {missing}")
        pytest.skip(missing)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM  # type: ignore[assignment]
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--window-size=1280,2000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def _click(driver: Any, label: str) -> None:
    from selenium.webdriver.common.by import By

    driver.find_element(By.XPATH, f"//button[normalize-space()='{label}']").click()


def _page_text(driver: Any) -> str:
    return str(driver.execute_script("return document.body.innerText"))


def _wait_for_text(driver: Any, pattern: str, timeout: float = 20.0) -> re.Match[str]:
    from selenium.webdriver.support.ui import WebDriverWait

    found: list[re.Match[str]] = []

    def seen(d: Any) -> bool:
        match = re.search(pattern, _page_text(d))
        if match:
            found.append(match)
        return match is not None

    WebDriverWait(driver, timeout, poll_frequency=0.2).until(seen, f"page never showed {pattern!r}")
    return found[-1]


@needs_gunicorn
def test_dashboard_charts_429s_with_retry_after_and_the_breaker_opening(tmp_path: Path, browser: Any) -> None:
    # One worker: the page's polls and its requests meet the same limiters and breaker.
    with serve(tmp_path, "gunicorn", "--workers", "1", "--threads", "8") as server:
        browser.get(server.url + "/")
        _wait_for_text(browser, r"pid \d+")  # the first poll answered: the page is live
        _wait_for_text(browser, r"Adaptive limit \(littles_law\)")  # issue 12: the acquirer's limit moves

        _click(browser, "Send 20 at once")  # one client, 10 per period: about half are 429
        retry = _wait_for_text(browser, r"429 Retry-After: (\d+)")
        assert int(retry.group(1)) >= 1  # computed from the limiter's state, never 0

        _click(browser, "Down")
        _wait_for_text(browser, r"partner DOWN")
        for _ in range(3):  # failures past the breaker's minimum; the per-client budget is per period
            request(server.url + "/authorize", "POST", b"", {"X-Forwarded-For": "198.18.9.1"})
        for i in range(12):
            request(server.url + "/authorize", "POST", b"", {"X-Forwarded-For": f"198.18.9.{10 + i}"})
        _wait_for_text(browser, r"\bOPEN\b")
    assert "Traceback" not in server.log(), server.log()
