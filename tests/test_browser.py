"""The report opens in a real browser from disk: every image loads, every internal link resolves,
the console shows no errors. Needs Debian's chromium + chromium-driver (.ci/run installs them)."""

import shutil
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from tests.conftest import artifacts_dir

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


@pytest.fixture(scope="module")
def browser():
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("headless Chromium test needs Debian's chromium and chromium-driver packages")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1280,900"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    yield driver
    driver.quit()


def _check_page(driver, page: Path) -> dict:
    driver.get(page.as_uri())
    images = driver.execute_script(
        "return Array.from(document.images).map(i => [i.getAttribute('src'), i.complete, i.naturalWidth, i.alt]);")
    links = driver.execute_script("return Array.from(document.links).map(a => a.getAttribute('href'));")
    for src, complete, width, alt in images:
        assert complete and width > 0, f"{page.name}: image {src} did not load"
        assert alt, f"{page.name}: image {src} has no alt text"
    for href in links:
        parsed = urlparse(href)
        if parsed.scheme in ("http", "https"):
            continue  # none expected; the report must work offline
        if href.startswith("#"):
            assert driver.execute_script("return document.getElementById(arguments[0]) !== null;", href[1:]), \
                f"{page.name}: link {href} has no target"
        else:
            target = (page.parent / unquote(parsed.path)).resolve()
            assert target.exists(), f"{page.name}: link {href} points to missing {target}"
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
    return {"images": len(images), "links": len(links)}


def test_report_renders_in_chromium(browser, tiny_run):
    _, run_dir = tiny_run
    counts = _check_page(browser, run_dir / "index.html")
    assert counts["images"] >= 7 and counts["links"] >= 15
    html = (run_dir / "index.html").read_text()
    assert "http://" not in html and "https://" not in html  # no CDN, no network
    height = browser.execute_script("return document.documentElement.scrollHeight;")
    browser.set_window_size(1280, min(height + 50, 16000))
    shot = artifacts_dir() / "report.png"
    browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
    _check_page(browser, run_dir.parent / "index.html")
