"""The report in a real browser: headless Debian chromium driven by Playwright for Python.

Skipped (with the reason) only where chromium or playwright is missing; `make test` installs
both (see the Makefile).
"""

import io
import os
import shutil

import numpy as np
import pytest

from structlens.report.html import SECTIONS

CHROMIUM = os.environ.get("STRUCTLENS_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="module")
def page(analysis_dir):
    playwright = pytest.importorskip(
        "playwright.sync_api", reason="playwright is not installed (pip install playwright)"
    )
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        pytest.skip(f"no chromium at {CHROMIUM} (apt-get install chromium)")
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        pg = browser.new_page(viewport={"width": 1200, "height": 900})
        errors = []
        pg.on("console", lambda m: errors.append(m.text) if m.type in ("error", "warning") else 0)
        pg.on("pageerror", lambda e: errors.append(str(e)))
        requests = []
        pg.on("request", lambda r: requests.append(r.url))
        pg.goto((analysis_dir / "report.html").as_uri())
        pg.wait_for_load_state("load")
        pg.errors, pg.requests = errors, requests
        yield pg
        browser.close()


def test_loads_without_console_errors_or_requests(page, analysis_dir):
    assert page.errors == []
    assert page.requests == [(analysis_dir / "report.html").as_uri()]


def test_every_section_and_figure_is_present(page, analysis):
    for method in ["summary", *SECTIONS]:
        assert page.locator(f"section#{method}").count() == 1
    expected = {
        "fig-tasks", "fig-koopman-convergence", "fig-koopman-spectrum", "fig-koopman-invariance",
        "fig-ndm-merges", "fig-ndm-gini", "fig-kappa", "fig-kappa-spectra", "fig-wedge",
        "fig-equivalence", "fig-layer-similarity",
    }  # fmt: skip
    if not analysis["ndm"]["details"]["gini"]:  # no patching test passes the screen: no Gini
        expected.remove("fig-ndm-gini")
    ids = set(page.eval_on_selector_all("figure.fig", "els => els.map(e => e.id)"))
    assert ids == expected
    for fig in expected:
        box = page.locator(f"#{fig} svg").bounding_box()
        assert box["width"] > 100 and box["height"] > 100
        assert page.locator(f"#{fig} figcaption").inner_text().strip()


def test_table_sorts_on_header_click(page):
    table = page.locator("#kappa-table")
    header = table.locator("th", has_text="κ (erank)")

    def column():
        return [float(v) for v in table.locator("tbody tr td:nth-child(2)").evaluate_all(
            "tds => tds.map(td => td.getAttribute('data-v'))")]  # fmt: skip

    header.click()
    assert column() == sorted(column())
    header.click()
    assert column() == sorted(column(), reverse=True)
    assert header.get_attribute("aria-sort") == "descending"


def test_preimage_search_finds_a_known_context(page, analysis):
    browser = analysis["ndm"]["details"]["browser"]
    entry = next(e for e in browser["entries"] if e["context"][1].strip().isalpha())
    before, token, after = entry["context"]
    page.fill("#preimage-search", token.strip())
    results = page.locator("#preimage-results li")
    texts = results.all_inner_texts()
    assert any(before + token + after in t for t in texts)
    assert token.strip() in [m.strip() for m in results.locator("mark").all_inner_texts()]


def test_query_box_lists_the_precomputed_neighbours(page, analysis):
    browser = analysis["ndm"]["details"]["browser"]
    entry = browser["entries"][0]
    page.select_option("#preimage-subspace", "0")
    page.fill("#preimage-query", "".join(entry["context"]))
    page.click("#preimage-query-go")
    items = page.locator("#preimage-neighbours > li")
    want = [j for j, _ in browser["neighbours"][0][0]]
    assert items.count() == 1 + len(want)
    first = browser["entries"][want[0]]["context"]
    assert "".join(first) in items.nth(1).inner_text()


def test_top_contexts_follow_the_subspace(page, analysis):
    browser = analysis["ndm"]["details"]["browser"]
    last = len(browser["partition"]) - 1
    page.select_option("#preimage-subspace", str(last))
    shown = page.locator("#preimage-top li").all_inner_texts()
    assert len(shown) == len(browser["top"][last])
    assert "".join(browser["entries"][browser["top"][last][0]]["context"]) in shown[0]


def test_screenshot_is_not_blank(page):
    from PIL import Image

    page.evaluate("window.scrollTo(0, 0)")
    png = page.screenshot(full_page=False)
    pixels = np.asarray(Image.open(io.BytesIO(png)).convert("L"), dtype=float)
    assert pixels.std() > 10  # text, tables and rules, not a blank or single-colour page
