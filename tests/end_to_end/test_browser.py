"""The dashboard in a real browser: `streamlit run` as a subprocess, Debian's Chromium headless shell via Playwright.

Screenshots of every page land in artifacts/screenshots/ (git-ignored) for a person to look at.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from playwright.sync_api import Browser, Locator, Page, expect

from bench.load import CHROMIUM, READY, serve
from tests.helpers.dashboard_fixtures import add_benches, add_trees, build

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                reason=f"no Chromium headless shell at {CHROMIUM} (`make browser` installs it)")

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "artifacts" / "screenshots"
WAIT_MS = 30_000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The app over the fixture database, given with `-- --db` (the AppTest tests use SPECDASH_DB)."""
    folder = tmp_path_factory.mktemp("browser")
    db = add_trees(add_benches(build(folder / "runs.duckdb")))
    with serve(db, folder / "streamlit.log", timeout_s=60) as url:
        yield url


def _open(browser: Browser, url: str, content: str) -> Page:
    """A page in a fresh context (its own cookies and session), once the script ran and `content` is there."""
    page = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True).new_page()
    page.set_default_timeout(WAIT_MS)
    page.goto(url)
    _settle(page, content)
    return page


def _settle(page: Page, content: str) -> None:
    page.wait_for_selector(content)
    page.wait_for_selector(READY)


def _metric_value(page: Page, label: str) -> Locator:
    metric = page.locator('[data-testid="stMetric"]').filter(has_text=label)
    return metric.locator('[data-testid="stMetricValue"]')


def _metric(page: Page, label: str) -> str:
    return _metric_value(page, label).inner_text()


def _screenshot(page: Page, name: str) -> None:
    """The whole page: the viewport grows to the content, since Streamlit scrolls inside its main block."""
    height = page.evaluate("document.querySelector('[data-testid=\"stMainBlockContainer\"]').scrollHeight")
    page.set_viewport_size({"width": 1400, "height": max(1000, height + 150)})
    page.wait_for_timeout(800)  # charts re-render at the new size
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SHOTS / f"{name}.png")


def _pick(page: Page, key: str, option: str, multi: bool = False) -> None:
    """Choose `option` in the select widget with key `key` by typing, as a person would."""
    field = page.locator(f".st-key-{key} input")
    field.click()
    field.fill(option)
    page.get_by_role("option", name=option, exact=True).click()
    if multi:  # a multiselect stays open for more picks (Escape would clear a selectbox's pick)
        page.keyboard.press("Escape")


def _wait_for_param(page: Page, key: str, value: str) -> None:
    """The browser has put the widget's value into the URL."""
    page.wait_for_function("([key, value]) => new URL(location.href).searchParams.get(key) === value",
                           arg=[key, value])


def test_every_page_shows_real_content(server, browser):
    page = _open(browser, f"{server}/", '[data-testid="stVegaLiteChart"]')
    expect(page.locator('[data-testid="stVegaLiteChart"]')).to_have_count(3)
    expect(page.locator('[data-testid="stDataFrame"]').first).to_be_visible()
    # the 9 chain runs and the tree run c2-tree-k3; the headline's answer per category, on the prompts all cells ran
    assert _metric(page, "speculative runs") == "10"
    # the answer is a table: its cells are the grid's accessible copy, drawn on a canvas
    expect(page.get_by_text("greedy · skinny kernels · 2 threads · cpu").first).to_be_attached()
    expect(page.get_by_text("prompt lookup (ngram) at k=4 · fixed").first).to_be_attached()  # code's answer
    expect(page.get_by_text("prompt lookup (ngram) at k=2 · fixed").first).to_be_attached()  # poem's
    _screenshot(page, "overview")

    page = _open(browser, f"{server}/compare", '[data-testid="stVegaLiteChart"]')
    expect(page.get_by_role("heading", name="Leaderboard")).to_be_visible()
    expect(page.get_by_role("heading", name="Which k")).to_be_visible()
    # the leaderboard, the head to head, the k advisor's table
    expect(page.locator('[data-testid="stDataFrame"]')).to_have_count(3)
    _screenshot(page, "compare")

    page = _open(browser, f"{server}/bench", '[data-testid="stVegaLiteChart"]')
    assert _metric(page, "goals met") == "1 of 2"  # the newest bench, b-new
    # plain, speculative, a draft-length policy's row, and the verify curves on the skinny kernels and on stock
    expect(page.locator('[data-testid="stDataFrame"]')).to_have_count(5)
    _screenshot(page, "bench")

    page = _open(browser, f"{server}/replay?run=p1-ls-k4", 'span[data-fate="bonus"]')
    expect(page.get_by_text("poem/poem-01 · layer skip (layerskip:2) k=4 · greedy")).to_be_visible()
    text = page.locator(".specdash-tokens").nth(1)  # the first one is the legend
    assert [span.get_attribute("data-fate") for span in text.locator("span").all()] == [
        "accepted", "accepted", "accepted", "correction", "correction", "accepted", "accepted", "accepted",
        "accepted", "bonus", "accepted", "bonus"]
    assert _metric(page, "lossless") == "✗"
    _screenshot(page, "replay")
    page.get_by_role("button", name="open the baseline run poem-01-base").click()
    _wait_for_param(page, "run", "poem-01-base")
    expect(page.get_by_text("poem/poem-01 · plain decoding · greedy")).to_be_visible()

    page = _open(browser, f"{server}/replay?run=c2-tree-k3", '[data-testid="stVegaLiteChart"]')
    expect(page.get_by_text("A tree round")).to_be_visible()
    expect(page.locator('[data-testid="stVegaLiteChart"]')).to_have_count(1)
    _screenshot(page, "replay_tree")

    page = _open(browser, f"{server}/sql", '.st-key-sql textarea')
    page.get_by_role("button", name="thrown-away drafts").click()
    _settle(page, '[data-testid="stDataFrame"]')
    expect(page.get_by_text("5 rows in")).to_be_visible()  # (draft, k): four of chains, one of the tree
    _screenshot(page, "sql")


def test_a_copied_url_reopens_the_same_view(server, browser):
    page = _open(browser, f"{server}/", '[data-testid="stVegaLiteChart"]')
    _pick(page, "category", "poem", multi=True)
    _wait_for_param(page, "category", "poem")
    # The URL changes as the pick is made, before the rerun it starts has run: wait for that rerun's figure.
    expect(_metric_value(page, "speculative runs")).to_have_text("4")
    shared = _open(browser, page.url, '[data-testid="stVegaLiteChart"]')
    assert _metric(shared, "speculative runs") == "4"
    expect(shared.locator(".st-key-category")).to_contain_text("poem")

    # A URL may name a draft by its spec: the address bar names it as the filter does once the page is there.
    page = _open(browser, f"{server}/compare?draft=layerskip:2&category=poem", '[data-testid="stVegaLiteChart"]')
    _wait_for_param(page, "draft", "layer skip (layerskip:2)")
    assert page.url == f"{server}/compare?draft=layer+skip+%28layerskip%3A2%29&category=poem"
    expect(page.locator(".st-key-draft")).to_contain_text("layer skip (layerskip:2)")
    page.go_back()  # to the address as typed: its widgets are drawn by now, and the filter holds all the same
    page.wait_for_url(f"{server}/compare?draft=layer+skip+%28layerskip%3A2%29&category=poem")
    _settle(page, '[data-testid="stVegaLiteChart"]')
    expect(page.locator(".st-key-draft")).to_contain_text("layer skip (layerskip:2)")
    expect(page.locator('[data-testid="stException"]')).to_have_count(0)

    page = _open(browser, f"{server}/replay", ".st-key-run input")
    _pick(page, "run", "p1-ng-k2")
    _wait_for_param(page, "run", "p1-ng-k2")
    shared = _open(browser, page.url, 'span[data-fate="plain"]')
    expect(shared.get_by_text("poem/poem-01 · prompt lookup (ngram) k=2 · greedy")).to_be_visible()

    query = "SELECT draft, count(*) AS runs FROM runs GROUP BY draft ORDER BY draft"
    page = _open(browser, f"{server}/sql", ".st-key-sql textarea")
    page.locator(".st-key-sql textarea").fill(query)
    page.locator(".st-key-sql textarea").blur()
    _wait_for_param(page, "sql", query)
    shared = _open(browser, page.url, ".st-key-sql textarea")
    expect(shared.locator(".st-key-sql textarea")).to_have_value(query)
    expect(shared.locator('[data-testid="stDataFrame"]')).to_have_count(0)  # it runs only on a click
    shared.get_by_role("button", name="Run").click()
    _settle(shared, '[data-testid="stDataFrame"]')
    expect(shared.get_by_text("4 rows in")).to_be_visible()  # none, layerskip:2, ngram, ngram-tree


def test_sql_result_downloads_as_csv(server, browser):
    query = "SELECT run_id, k, new_tokens FROM runs WHERE draft = 'ngram' ORDER BY run_id"
    page = _open(browser, f"{server}/sql?sql={quote(query)}", ".st-key-sql textarea")
    page.get_by_role("button", name="Run").click()
    _settle(page, '[data-testid="stDownloadButton"]')
    with page.expect_download() as download:
        page.get_by_role("button", name="Download CSV").click()
    content = Path(download.value.path()).read_text()
    assert list(csv.reader(io.StringIO(content))) == [
        ["run_id", "k", "new_tokens"], ["c1-ng-k2", "2", "12"], ["c1-ng-k4", "4", "12"], ["c2-ng-k2", "2", "12"],
        ["p1-ng-k2", "2", "12"], ["p1-ng-k4", "4", "12"]]
