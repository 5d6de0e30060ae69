"""The login in front of the pages, when the secrets configure Streamlit's OpenID Connect login (`[auth]`).

Who may read is the allow-list `allowed` under `[specdash]` in the same secrets: e-mail addresses ("ana@lab.org")
and whole domains ("@lab.org"), compared without regard to case. With `[auth]` and no allow-list nobody is let
in: a login that admits everyone the provider knows is rarely what a team server means.

A shared URL survives the login. The provider sends the browser back to the app's root, in a new session, so the
gate keeps the page and query string it was opened on in the tab's sessionStorage, and the first page after the
login goes back there.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import streamlit as st

from runner.serve import open_warning

VIEW_KEY = "specdash-view-before-login"
_REMEMBER_VIEW = f"<script>sessionStorage.setItem('{VIEW_KEY}', location.pathname + location.search);</script>"
# Only a path on this origin: the stored value came from location, but a path like //host would leave it.
_RETURN_TO_VIEW = f"""<script>
const view = sessionStorage.getItem('{VIEW_KEY}');
sessionStorage.removeItem('{VIEW_KEY}');
if (view !== null) {{
  const target = new URL(view, location.origin);
  if (target.origin === location.origin && target.href !== location.href) location.replace(target.href);
}}
</script>"""


def is_allowed(email: str | None, allowed: Sequence[str]) -> bool:
    """Whether `email` is on the allow-list: an entry is one address, or a whole domain written "@domain" (its
    subdomains not included). Case is ignored, as providers and people write addresses either way."""
    if not email or "@" not in email:
        return False
    address = email.strip().lower()
    entries = {entry.strip().lower() for entry in allowed}
    return address in entries or "@" + address.rsplit("@", 1)[1] in entries


def verified_email(user: Mapping[str, object]) -> str | None:
    """The user's e-mail address, or None when there is none or the provider says it is unverified: an address
    someone typed into their profile unchecked must not pass for a colleague's."""
    if str(user.get("email_verified", True)).lower() == "false":
        return None
    email = user.get("email")
    return email if isinstance(email, str) else None


def configured() -> bool:
    """Whether the secrets configure the login. A secrets file that does not parse raises: the dashboard then
    shows that error and nothing else, rather than opening without the login it was meant to have."""
    try:
        return "auth" in st.secrets
    except FileNotFoundError:  # Streamlit's error for no secrets file, and for one it cannot parse
        if any(Path(name).exists() for name in st.get_option("secrets.files")):
            raise
        return False


def allow_list() -> list[str]:
    """`allowed` under `[specdash]`; one string stands for a list of one."""
    allowed = st.secrets.get("specdash", {}).get("allowed", [])
    return [allowed] if isinstance(allowed, str) else [str(entry) for entry in allowed]


def providers() -> list[str | None]:
    """The providers to offer: None for the one configured in `[auth]` itself, then each `[auth.<name>]`."""
    auth = st.secrets["auth"]
    named = [name for name, value in auth.items() if isinstance(value, Mapping) and "client_id" in value]
    return ([None] if "client_id" in auth else []) + named


@st.cache_resource(show_spinner=False)
def _say_open_once(address: str | None, port: int) -> None:
    # In the terminal that started `streamlit run`, once per process, not on every page view.
    if warning := open_warning(address, port):
        print(warning, file=sys.stderr, flush=True)


def _login_page() -> None:
    st.title("specdash")
    st.write("Log in to see the runs.")
    st.html(_REMEMBER_VIEW, unsafe_allow_javascript=True)
    if not providers():
        st.error("[auth] in .streamlit/secrets.toml names no provider: give it client_id, client_secret and "
                 "server_metadata_url, or add [auth.<name>] sections with them.")
    for provider in providers():
        if st.button("Log in" if provider is None else f"Log in with {provider}", type="primary"):
            st.login(provider)


def _refusal(email: str | None, allowed: list[str]) -> None:
    if not allowed:
        st.error("Nobody may read this dashboard yet: list e-mail addresses or @domains as `allowed` under "
                 "`[specdash]` in .streamlit/secrets.toml.")
    else:
        st.error(f"{email or 'This account (no verified e-mail address)'} may not read this dashboard.")
    if st.button("Log out"):
        st.logout()


def gate() -> bool:
    """True when the pages may render: no login configured, or a logged-in user on the allow-list. Otherwise the
    login or the refusal is all that is shown."""
    if not configured():
        _say_open_once(st.get_option("server.address"), st.get_option("server.port"))
        return True
    if not st.user.is_logged_in:
        _login_page()
        return False
    email, allowed = verified_email(st.user.to_dict()), allow_list()
    if not is_allowed(email, allowed):
        _refusal(email, allowed)
        return False
    st.sidebar.html(_RETURN_TO_VIEW, unsafe_allow_javascript=True)
    st.sidebar.caption(f"logged in as {email}")
    if st.sidebar.button("Log out"):
        st.logout()
    return True
