"""Headless Chromium from Debian's packages, driven by selenium through chromedriver.

`chrome` installs ``chromium`` and ``chromium-driver`` with apt when they are missing
and the tests run as root (as CI does), and skips loudly, saying why, when they cannot
be had.  Screenshots go to ``out/dashboard/`` of the project (`SHOTS`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]
SHOTS = PROJECT / "out" / "dashboard"
PACKAGES = ("chromium", "chromium-driver")


def installed() -> tuple[str, str] | None:
    """The browser's and its driver's executables, when both are there."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


def install() -> str:
    """Install the browser with apt; what went wrong, or an empty string."""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return "not root, or no apt-get: install chromium and chromium-driver by hand"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (
        ["apt-get", "install", "-y", "-qq", *PACKAGES],
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", *PACKAGES],
    ):
        done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
        if done.returncode == 0 and argv[1] == "install":
            return ""
        if done.returncode != 0 and argv[1] == "update":
            return f"apt-get update failed: {done.stderr.strip()[-300:]}"
    return f"apt-get install {' '.join(PACKAGES)} failed: {done.stderr.strip()[-300:]}"


@pytest.fixture(scope="session")
def chrome() -> Iterator[object]:
    """A headless Chromium whose console log is kept (``get_log("browser")``)."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
    found = installed()
    if found is None:
        problem = install()
        found = installed()
        if found is None:
            pytest.skip(f"SKIPPED LOUDLY: no headless Chromium for the browser tests: {problem}")
    browser, driver_path = found
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1100,900"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = webdriver.ChromeService(executable_path=driver_path)
    driver = webdriver.Chrome(options=options, service=service)
    SHOTS.mkdir(parents=True, exist_ok=True)
    try:
        yield driver
    finally:
        driver.quit()
