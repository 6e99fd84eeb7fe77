"""A real browser for the page and report tests: Debian's headless Chromium driven by selenium
through chromium-driver (both installed by .ci/run), and `ember serve`'s app on a free port in a
thread. Tests skip with the reason when Chromium, its driver or selenium is missing."""

from __future__ import annotations

import shutil
import socket
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

# The machine has no network: nothing in the browser may try to reach one.
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                  "--window-size=1100,900")


def chromium_paths() -> tuple[str | None, str | None]:
    browser = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
    driver = shutil.which("chromedriver") or next(
        (p for p in ("/usr/lib/chromium/chromedriver", "/usr/bin/chromedriver") if Path(p).is_file()), None)
    return browser, driver


def missing_browser() -> str:
    """Why no browser test can run here ("" when one can)."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    browser, driver = chromium_paths()
    if browser is None or driver is None:
        return "no Chromium here (Debian: apt-get install chromium chromium-driver; .ci/run installs them)"
    return ""


@contextmanager
def chromium():
    """A headless Chromium with a fresh profile, closed afterwards."""
    import os

    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")  # selenium must not look for drivers online
    browser, driver_path = chromium_paths()
    profile = tempfile.mkdtemp(prefix="ember-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in CHROMIUM_FLAGS + (f"--user-data-dir={profile}",):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def browser_or_skip():
    reason = missing_browser()
    if reason:
        pytest.skip(f"browser test skipped: {reason}")
    return chromium()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serving(run_dir, backend: str = ""):
    """`ember serve`'s app for ``run_dir`` on a free local port (uvicorn in a thread): its URL."""
    import uvicorn

    from ember.serve.app import create_app
    from ember.serve.predictor import load_predictor

    app = create_app(load_predictor(run_dir, backend))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started:
        if time.time() > deadline or not thread.is_alive():
            raise RuntimeError(f"the server for {run_dir} did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def fill(driver, method: str, name: str, text: str) -> None:
    """Open the method's tab and type ``text`` into its field ``name`` as a person would
    (clearing it first)."""
    from selenium.webdriver.common.by import By

    driver.find_element(By.ID, f"tab-{method}").click()
    field = driver.find_element(By.ID, f"field-{method}-{name}")
    field.clear()
    field.send_keys(text)


def submit_and_wait(driver, method: str, timeout: float = 30.0) -> str:
    """Click the method's button; wait for its result (or error) and return the result's text."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.find_element(By.ID, f"tab-{method}").click()
    result = driver.find_element(By.ID, f"result-{method}")
    driver.execute_script("arguments[0].replaceChildren()", result)
    driver.find_element(By.ID, f"submit-{method}").click()
    WebDriverWait(driver, timeout).until(
        lambda d: result.text and "Running" not in result.text and
        d.find_element(By.ID, f"submit-{method}").is_enabled())
    return result.text
