"""The chat page in headless Chromium (Debian's chromium + chromium-driver, driven through Selenium): type a
question, watch the answer stream in, see its sources as links.

Skipped when Chromium or its driver is missing, unless SHARED_ENGINE_REQUIRE_CHROMIUM=1 (set by
scripts/ci/setup_chromium.sh in CI), where a missing browser fails the test.
"""

from __future__ import annotations

import os
import shutil
import time

import pytest

QUESTION = "Which values count as false when an object is tested in an if statement?"


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    required = os.environ.get("SHARED_ENGINE_REQUIRE_CHROMIUM") == "1"
    if not (chromium and driver):
        message = "Chromium or chromedriver not installed (scripts/ci/setup_chromium.sh installs them)"
        pytest.fail(message) if required else pytest.skip(message)
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager must not try to download anything
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        options.add_argument(flag)
    session = webdriver.Chrome(options=options, service=Service(executable_path=driver))
    yield session
    session.quit()


def test_page_streams_an_answer_and_lists_its_sources(app, browser):
    from selenium.webdriver.common.by import By

    browser.get(app.url + "/")
    assert browser.title == "Python Docs Assistant"
    browser.find_element(By.ID, "question").send_keys(QUESTION)
    browser.find_element(By.ID, "ask").click()

    # Poll while the answer streams: the text must be seen growing before the page reports `done`.
    lengths: list[int] = []
    deadline = time.monotonic() + 300
    state = None
    while time.monotonic() < deadline:
        state = browser.find_element(By.TAG_NAME, "body").get_attribute("data-state")
        text = browser.find_element(By.ID, "answer").text
        if state == "streaming" and text and (not lengths or len(text) != lengths[-1]):
            lengths.append(len(text))
        if state in ("done", "error"):
            break
        time.sleep(0.05)
    stats = browser.find_element(By.ID, "stats").text
    assert state == "done", stats
    answer = browser.find_element(By.ID, "answer").text
    assert answer.strip() and len(lengths) >= 2, lengths
    links = browser.find_elements(By.CSS_SELECTOR, "#sources li a")
    assert len(links) == 4 and all(a.text for a in links)
    assert any(a.get_attribute("href").endswith("/library/stdtypes.html#truth") for a in links)
    assert "TTFT" in stats and "tokens/s" in stats
