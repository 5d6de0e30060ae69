"""The login in front of the dashboard: Streamlit's st.login against a real OpenID Connect provider
(oidc-provider-mock on localhost: discovery, JWKS, signed ID tokens, its own authorization page) in Chromium; the
allow-list's matching; `runner serve --auth` and the warning for a dashboard open to the network."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import oidc_provider_mock
import pytest
from playwright.sync_api import Browser, Page, expect
from typer.testing import CliRunner

from bench.load import CHROMIUM, READY, free_port, serve
from dashboard.login import is_allowed, verified_email
from runner.cli import app
from runner.serve import auth_configured, check_login, open_warning
from tests.helpers.dashboard_fixtures import add_benches, add_trees, build

ROOT = Path(__file__).resolve().parents[2]
WAIT_MS = 60_000
USERS = [  # sub, e-mail: each user's subject differs from their address, so the address is what is checked
    oidc_provider_mock.User(sub="ana", claims={"email": "ana@team.org", "email_verified": True}),
    oidc_provider_mock.User(sub="bo", claims={"email": "Bo@Lab.Org", "email_verified": True}),
    oidc_provider_mock.User(sub="eve", claims={"email": "eve@other.org", "email_verified": True}),
]
DATA = '[data-testid="stDataFrame"], [data-testid="stVegaLiteChart"], [data-testid="stMetric"], .specdash-tokens'
browser_needed = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Chromium headless shell at {CHROMIUM}")


def secrets(app_port: int, provider_url: str) -> str:
    return f"""\
[auth]
redirect_uri = "http://127.0.0.1:{app_port}/oauth2callback"
cookie_secret = "a test secret, long enough for HS256"
client_id = "specdash"
client_secret = "specdash-secret"
server_metadata_url = "{provider_url}/.well-known/openid-configuration"

[specdash]
allowed = ["@team.org", "bo@lab.org"]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The provider on a free port, and the app over the fixture database behind it, reading the secrets in its
    own working folder."""
    folder = tmp_path_factory.mktemp("login")
    db = add_trees(add_benches(build(folder / "runs.duckdb")))
    port = free_port()
    with oidc_provider_mock.run_server_in_thread(user_claims=USERS) as provider:
        (folder / ".streamlit").mkdir()
        (folder / ".streamlit" / "secrets.toml").write_text(secrets(port, f"http://localhost:{provider.server_port}"))
        with serve(db, folder / "streamlit.log", port=port, timeout_s=60, cwd=folder) as url:
            yield url


def _open(browser: Browser, url: str, content: str) -> Page:
    """A page in a fresh context (no login cookie), once the script ran and `content` is there."""
    page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
    page.set_default_timeout(WAIT_MS)
    page.goto(url)
    _settle(page, content)
    return page


def _settle(page: Page, content: str) -> None:
    page.wait_for_selector(content)
    page.wait_for_selector(READY)


def _log_in(page: Page, sub: str) -> None:
    """Through the provider's own authorization page, as a person would."""
    page.get_by_role("button", name="Log in", exact=True).click()
    page.get_by_placeholder("sub").fill(sub)
    page.get_by_role("button", name="Authorize").click()


def _log_out(page: Page, button: Page) -> None:
    """The provider's end-session page follows the logout; it sends the browser back to the app."""
    button.get_by_role("button", name="Log out").click()
    page.get_by_role("button", name="End session").click()
    _settle(page, 'button:has-text("Log in")')


def _metric(page: Page, label: str) -> str:
    metric = page.locator('[data-testid="stMetric"]').filter(has_text=label)
    return metric.locator('[data-testid="stMetricValue"]').inner_text()


def _shows_no_data(page: Page) -> None:
    expect(page.locator(DATA)).to_have_count(0)
    body = page.locator("body")
    for fixture_text in ("poem", "ngram", "runs.duckdb", "speculative runs", "sweep"):
        expect(body).not_to_contain_text(fixture_text)


@browser_needed
def test_before_login_every_page_shows_only_the_login(server, browser):
    for path in ("/", "/replay?run=p1-ls-k4", "/sql?sql=SELECT%20*%20FROM%20runs", "/compare"):
        page = _open(browser, server + path, 'button:has-text("Log in")')
        expect(page.get_by_text("Log in to see the runs.")).to_be_visible()
        _shows_no_data(page)
        expect(page.locator(".st-key-sql textarea")).to_have_count(0)
        expect(page.locator('[data-testid="stSidebarNav"]')).to_have_count(0)
        page.context.close()


@browser_needed
def test_an_allowed_user_sees_the_overview_and_logging_out_shuts_it_again(server, browser):
    page = _open(browser, f"{server}/", 'button:has-text("Log in")')
    _log_in(page, "ana")
    _settle(page, '[data-testid="stVegaLiteChart"]')
    assert page.url == f"{server}/"
    assert _metric(page, "speculative runs") == "10"  # the values test_browser.py reads on the open dashboard
    expect(page.get_by_text("prompt lookup (ngram) at k=4 · fixed").first).to_be_attached()  # code's answer
    expect(page.get_by_text("prompt lookup (ngram) at k=2 · fixed").first).to_be_attached()  # poem's
    sidebar = page.locator('[data-testid="stSidebar"]')
    expect(sidebar.get_by_text("logged in as ana@team.org")).to_be_visible()
    _log_out(page, sidebar)
    _shows_no_data(page)
    page.goto(f"{server}/")  # the login cookie is gone: a fresh load is at the gate too
    _settle(page, 'button:has-text("Log in")')
    _shows_no_data(page)


@browser_needed
def test_a_shared_url_is_where_the_login_ends(server, browser):
    page = _open(browser, f"{server}/replay?run=p1-ls-k4", 'button:has-text("Log in")')
    _log_in(page, "bo")  # on the list by address, written in another case
    page.wait_for_url(f"{server}/replay?run=p1-ls-k4")
    _settle(page, 'span[data-fate="bonus"]')
    expect(page.get_by_text("poem/poem-01 · layer skip (layerskip:2) k=4 · greedy")).to_be_visible()

    page = _open(browser, f"{server}/?category=poem", 'button:has-text("Log in")')
    _log_in(page, "ana")
    page.wait_for_url(f"{server}/?category=poem")
    _settle(page, '[data-testid="stVegaLiteChart"]')
    assert _metric(page, "speculative runs") == "4"  # the poem runs only: the filter came through


@browser_needed
def test_the_sql_page_works_after_login(server, browser):
    page = _open(browser, f"{server}/sql", 'button:has-text("Log in")')
    _log_in(page, "ana")
    page.wait_for_url(f"{server}/sql")
    _settle(page, ".st-key-sql textarea")
    page.get_by_role("button", name="thrown-away drafts").click()
    _settle(page, '[data-testid="stDataFrame"]')
    expect(page.get_by_text("5 rows in")).to_be_visible()  # what test_browser.py counts on the open dashboard


@browser_needed
def test_a_user_not_on_the_list_is_refused_and_sees_no_data(server, browser):
    page = _open(browser, f"{server}/replay?run=p1-ls-k4", 'button:has-text("Log in")')
    _log_in(page, "eve")
    _settle(page, '[data-testid="stAlertContentError"]')
    expect(page.get_by_text("eve@other.org may not read this dashboard.")).to_be_visible()
    _shows_no_data(page)
    page.goto(f"{server}/replay?run=p1-ls-k4")  # logged in still, and still refused
    _settle(page, '[data-testid="stAlertContentError"]')
    _shows_no_data(page)
    _log_out(page, page.locator('[data-testid="stMain"]'))
    _shows_no_data(page)


@pytest.mark.parametrize(("email", "allowed", "expected"), [
    ("ana@team.org", ["ana@team.org"], True),
    ("Ana@Team.ORG", ["ana@team.org"], True),  # case: either side
    ("ana@team.org", ["ANA@TEAM.org"], True),
    (" ana@team.org ", ["ana@team.org"], True),
    ("ana@team.org", ["@team.org"], True),  # the whole domain
    ("ana@TEAM.org", ["@Team.Org"], True),
    ("ana@sub.team.org", ["@team.org"], False),  # a subdomain is another domain
    ("ana@evilteam.org", ["@team.org"], False),
    ("ana@team.org.evil.com", ["@team.org"], False),
    ("bo@team.org", ["ana@team.org"], False),  # another address on the same domain
    ("ana@team.org", ["team.org"], False),  # a domain is written with its @
    ("ana@team.org", [], False),  # no allow-list: nobody
    ("", ["@team.org"], False),
    (None, ["@team.org"], False),
    ("team.org", ["@team.org", "team.org"], False),  # not an address
])
def test_the_allow_list_matches_addresses_and_domains(email, allowed, expected):
    assert is_allowed(email, allowed) is expected


def test_an_unverified_address_counts_as_none():
    assert verified_email({"email": "ana@team.org", "email_verified": True}) == "ana@team.org"
    assert verified_email({"email": "ana@team.org"}) == "ana@team.org"  # providers that do not say
    assert verified_email({"email": "ana@team.org", "email_verified": False}) is None
    assert verified_email({"email": "ana@team.org", "email_verified": "false"}) is None  # as a string (Cognito)
    assert verified_email({"sub": "ana"}) is None


def test_serve_auth_refuses_to_start_without_auth_in_the_secrets(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    result = CliRunner().invoke(app, ["serve", "--auth", "--db", str(tmp_path / "runs.duckdb"),
                                      "--port", str(free_port())])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "error: --auth: no [auth] section in the secrets the dashboard reads (.streamlit/secrets.toml here or in "
        "~/.streamlit/); see docs/sharing.md, \"Login\""]
    assert result.stdout == ""


def test_the_secrets_that_configure_auth(tmp_path):
    with_auth, without = tmp_path / "with.toml", tmp_path / "without.toml"
    with_auth.write_text('[auth]\nredirect_uri = "http://localhost:8501/oauth2callback"\n')
    without.write_text('[specdash]\nallowed = ["@team.org"]\n')
    folder = tmp_path / "mounted"  # Kubernetes style: one folder per section
    (folder / "auth").mkdir(parents=True)
    assert auth_configured([str(without), str(with_auth)])
    assert not auth_configured([str(without), str(tmp_path / "absent.toml")])
    assert auth_configured([str(folder)])
    assert not auth_configured([])


def test_an_open_dashboard_says_so_in_one_line_unless_it_is_local(tmp_path, monkeypatch, capsys):
    assert open_warning("127.0.0.1", 8501) is None and open_warning("localhost", 8501) is None
    assert open_warning("::1", 8501) is None
    assert open_warning("0.0.0.0", 8502) == (
        "warning: no login is configured ([auth] in .streamlit/secrets.toml) and the dashboard listens on 0.0.0.0: "
        "anyone who can reach port 8502 reads every run and can query the database")
    assert "listens on every network interface:" in open_warning(None, 8501)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    check_login("10.0.0.5", 8501, require_auth=False)
    check_login("127.0.0.1", 8501, require_auth=False)
    assert capsys.readouterr().err.splitlines() == [open_warning("10.0.0.5", 8501)]
    (tmp_path / ".streamlit").mkdir()
    (tmp_path / ".streamlit" / "secrets.toml").write_text('[auth]\nredirect_uri = "http://x/oauth2callback"\n')
    check_login("10.0.0.5", 8501, require_auth=True)  # behind the login: neither refused nor warned about
    assert capsys.readouterr().err == ""
