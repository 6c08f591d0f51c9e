"""Headless Chromium for the playground tests: a WebDriver whose profile and temporary files are removed after."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from typing import Any, Iterator

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
MISSING_REASON = (
    "Debian's chromium and chromium-driver are not installed "
    "(apt-get install chromium chromium-driver; CI installs them in .ci/run)"
)


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A selenium Chrome driver on headless Chromium, muted, autoplay allowed; quit and cleaned up on exit."""
    assert CHROMIUM and CHROMEDRIVER, "CI must install chromium and chromium-driver (.ci/run)"
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--autoplay-policy=no-user-gesture-required",
        "--mute-audio",
    ):
        options.add_argument(flag)
    # Short: Chromium puts a unix socket in its profile directory.
    browser_tmp = tempfile.mkdtemp(prefix="chr", dir="/tmp")
    options.add_argument(f"--user-data-dir={browser_tmp}/profile")
    driver = None
    try:
        env = {**os.environ, "TMPDIR": browser_tmp}
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER, env=env), options=options)
        yield driver
    finally:
        if driver is not None:
            driver.quit()
        shutil.rmtree(browser_tmp, ignore_errors=True)
