"""The page at GET / in a real browser: type, translate, hover a word, see what it attended to.

Headless Chromium from Debian's ``chromium`` and ``chromium-driver`` packages, driven by selenium
(no browser download). Without them the test skips, unless ``NMT_REQUIRE_BROWSER=1`` (set by
``.ci/run``, which installs them), where a skip would hide a broken page.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from nmt.inference.engine import Translator
from nmt.serve.app import create_app
from tests.conftest import save_tiny_checkpoint, serve_in_thread
from tests.test_server import serve_settings

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    missing = [name for name, path in (("chromium", CHROMIUM), ("chromedriver", CHROMEDRIVER)) if not path]
    try:
        from selenium import webdriver
    except ImportError:
        missing.append("selenium (pip install -e '.[dev]')")
    if missing:
        reason = f"needs {', '.join(missing)}: apt-get install -y chromium chromium-driver"
        if os.environ.get("NMT_REQUIRE_BROWSER") == "1":
            pytest.fail(f"NMT_REQUIRE_BROWSER=1 but the browser test {reason}")
        pytest.skip(reason)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1200,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def page_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    torch.set_num_threads(1)
    run = tmp_path_factory.mktemp("run")
    save_tiny_checkpoint(run / "checkpoints" / "best.pt", "additive")
    translator = Translator.from_checkpoint(run, device="cpu")
    with serve_in_thread(create_app(translator, serve_settings())) as url:
        yield url


def test_translate_and_hover_highlights_attended_words(browser, page_url: str, tmp_path: Path) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver = browser
    wait = WebDriverWait(driver, 30)
    driver.get(page_url + "/")
    wait.until(lambda d: "→" in d.find_element(By.ID, "model-info").text)  # /v1/model answered
    assert "de → en" in driver.find_element(By.ID, "model-info").text

    driver.find_element(By.ID, "source").send_keys("Ein Hund läuft über die Wiese.\nZwei Männer spielen Fußball.")
    driver.find_element(By.ID, "translate").click()
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".result table.attention")) == 2)
    first = driver.find_element(By.ID, "result-0")
    assert first.find_element(By.CSS_SELECTOR, "h2").text == "Ein Hund läuft über die Wiese."
    assert first.find_element(By.CLASS_NAME, "translation").text.strip()
    source_words = [th.text for th in first.find_elements(By.CSS_SELECTOR, "th.src-word")]
    assert source_words[-1] == "</s>" and len(source_words) >= 6
    target_words = first.find_elements(By.CSS_SELECTOR, "th.tgt-word")
    cells = first.find_elements(By.CSS_SELECTOR, "td.cell")
    assert target_words and len(cells) == len(target_words) * len(source_words)
    assert not first.find_elements(By.CSS_SELECTOR, ".highlight")

    ActionChains(driver).move_to_element(target_words[0]).perform()
    highlighted = first.find_elements(By.CSS_SELECTOR, "th.src-word.highlight")
    assert 1 <= len(highlighted) < len(source_words)  # the attended words, not all of them
    assert "hovered" in target_words[0].get_attribute("class")
    assert len(first.find_elements(By.CSS_SELECTOR, 'td.cell.active[data-tgt="0"]')) == len(source_words)
    assert not driver.find_element(By.ID, "result-1").find_elements(By.CSS_SELECTOR, ".highlight")  # only its card
    driver.save_screenshot(str(tmp_path / "page_hover_target.png"))

    ActionChains(driver).move_to_element(first.find_elements(By.CSS_SELECTOR, "th.src-word")[0]).perform()
    assert first.find_elements(By.CSS_SELECTOR, "th.tgt-word.highlight")
    assert not first.find_elements(By.CSS_SELECTOR, "th.src-word.highlight")
    assert (tmp_path / "page_hover_target.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
