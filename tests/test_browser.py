"""The report opens in a real browser from disk: every image loads, every internal link resolves,
the console shows no errors, and nothing is wider than the page (tables, the dtype audit's included).
Needs Debian's chromium + chromium-driver (.ci/run installs them)."""

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


# Page and every table, figure and code block, collapsed sections opened: scrollWidth against clientWidth (the
# page scrolls sideways, or a table is wider than the column it sits in, when a cell holds an unbreakable name).
LAYOUT_JS = """
const closed = Array.from(document.querySelectorAll('details:not([open])'));
closed.forEach(d => { d.open = true; });  // collapsed sections are measured too, as a reader who opens them sees them
const doc = document.documentElement;
const inner = el => { const s = getComputedStyle(el);
  return el.clientWidth - parseFloat(s.paddingLeft) - parseFloat(s.paddingRight); };
const wide = Array.from(document.querySelectorAll('table, figure, pre')).map(el => {
  const where = el.closest('[id]') ? el.closest('[id]').id : '';
  const section = Array.from(document.querySelectorAll('h2, h3, h4')).filter(
    h => h.compareDocumentPosition(el) & Node.DOCUMENT_POSITION_FOLLOWING).map(h => h.textContent).pop() || '';
  return [el.tagName + ' in ' + (where || section), Math.round(el.getBoundingClientRect().width),
          Math.round(inner(el.parentElement)), el.scrollWidth, el.clientWidth];
}).filter(([_, width, room, scroll, client]) => width > room + 1 || scroll > client + 1);
const page = [doc.scrollWidth, doc.clientWidth];
closed.forEach(d => { d.open = false; });
return {page: page, wide: wide, tables: document.querySelectorAll('table').length, viewport: window.innerWidth};
"""


def _check_layout(driver, page: Path, width: int) -> int:
    """The page already loaded (_check_page), laid out again at this window width: a resize re-runs the layout
    (and the media queries) as a load at that width would, without fetching and parsing the page again."""
    driver.set_window_size(width, 900)
    layout = driver.execute_script(LAYOUT_JS)
    assert layout["viewport"] == width, f"{page.name}: laid out at {layout['viewport']}px, not {width}px"
    scroll, client = layout["page"]
    assert scroll <= client, f"{page.name} at {width}px: the page scrolls sideways ({scroll} > {client})"
    assert not layout["wide"], f"{page.name} at {width}px: wider than their column: {layout['wide']}"
    return layout["tables"]


def test_report_renders_in_chromium(browser, tiny_run):
    _, run_dir = tiny_run
    counts = _check_page(browser, run_dir / "index.html")
    drawn = sorted((run_dir / "figures").glob("*.png"))  # every figure the run drew is on its page, and loads
    assert len(drawn) >= 5 and counts["images"] == len(drawn) and counts["links"] >= 15
    html = (run_dir / "index.html").read_text()
    assert "http://" not in html and "https://" not in html  # no CDN, no network
    for width in (1280, 1024):  # the dtype audit's tables were ~1,300 px in a 1,100 px page
        assert _check_layout(browser, run_dir / "index.html", width) >= 6
    browser.set_window_size(1280, 900)
    height = browser.execute_script("return document.documentElement.scrollHeight;")
    browser.set_window_size(1280, min(height + 50, 16000))
    shot = artifacts_dir() / "report.png"
    browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
    _check_page(browser, run_dir.parent / "index.html")
    _check_layout(browser, run_dir.parent / "index.html", 1024)
