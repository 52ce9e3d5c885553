"""Debian's headless chromium through its chromedriver: the dashboard's browser tests and docs/make_screenshot.py.

Selenium is given the driver's path, so Selenium Manager (which would
download a browser and driver) never runs; the flags keep chromium off the
network it would otherwise call (this machine's is closed).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webdriver import WebDriver

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


@contextlib.contextmanager
def chromium(profile: Path, *args: str, console: bool = False) -> Iterator[WebDriver]:
    """A browser on a fresh profile in ``profile``, with ``args`` added; ``console``: keep its console log."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (*CHROMIUM_ARGS, *args):
        options.add_argument(arg)
    options.add_argument(f"--user-data-dir={profile}")
    if console:
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
