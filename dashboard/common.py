"""What every page shares: where the database is, cached reads, the empty state, URL-bound filters."""

from __future__ import annotations

import argparse
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import duckdb
import pandas as pd
import streamlit as st
from streamlit.errors import StreamlitAPIException

from dashboard import filter_queries, queries, words
from runner.store.connect import READ_BOUND_S, open_db, upgrade
from runner.store.metrics import Filters
from runner.store.schema import StoreError
from runner.sweep import progress

T = TypeVar("T")
DB_ENV = "SPECDASH_DB"
DEFAULT_DB = "runs.duckdb"
# The URL parameter (and widget key, bind="query-params") of each filter whose field name is too long.
_URL_KEYS = {"sweep_id": "sweep", "concurrent_workers": "workers"}


def db_path() -> Path:
    """`--db PATH` after `--` on the streamlit command line, else $SPECDASH_DB, else ./runs.duckdb."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--db")
    # parse_known_args: under AppTest sys.argv is pytest's own command line.
    chosen = parser.parse_known_args(sys.argv[1:])[0].db or os.environ.get(DB_ENV) or DEFAULT_DB
    return Path(chosen).expanduser().resolve()


def _stamp(db: Path) -> tuple:
    """Changes whenever the runner commits (to the file or its WAL), so a refresh shows new runs."""
    stamp: list = []
    for path in (db, db.with_name(db.name + ".wal")):
        try:
            stat = path.stat()
            stamp += [stat.st_mtime_ns, stat.st_size]
        except FileNotFoundError:
            stamp += [None, None]
    return tuple(stamp)


# The read-only connection a page's render shares (one_connection), per session: Streamlit runs each session's
# script in a thread of its own.
_PAGE = threading.local()


@contextmanager
def one_connection() -> Iterator[None]:
    """Every `load` in the block reads through one read-only connection, opened at the first read that misses the
    cache and closed at the end. At 100M rounds a fresh connection starts with a cold cache: on one, the Compare
    page's reads take about two thirds of the time. A writer waits for the block (its lock retries are bounded);
    a page in the block must not open the file with another configuration (the SQL page's sandbox)."""
    _PAGE.shared, _PAGE.con = True, None
    try:
        yield
    finally:
        if _PAGE.con is not None:
            _PAGE.con.close()
        _PAGE.shared, _PAGE.con = False, None


@st.cache_data(ttl=600, max_entries=500, show_spinner=False)
def _cached(_query: Callable[..., T], name: str, db: str, stamp: tuple, args: tuple) -> T:
    # Streamlit cannot hash a function: `name` stands for `_query` in the cache key.
    if not getattr(_PAGE, "shared", False):
        return queries.read(db, _query, *args)
    if _PAGE.con is None:
        _PAGE.con, _ = open_db(db, read_only=True, bound_s=READ_BOUND_S)
    try:
        return _query(_PAGE.con, *args)
    except duckdb.IOException:  # e.g. a checkpoint met half-written: this read again, on a connection of its own
        _PAGE.con.close()
        _PAGE.con = None
        return queries.read(db, _query, *args)


def load(query: Callable[..., T], *args: object) -> T:
    """`query(con, *args)` on a short-lived read-only connection, cached until the file changes."""
    db = db_path()
    return _cached(query, f"{query.__module__}.{query.__qualname__}", str(db), _stamp(db), args)


@st.cache_data(ttl=600, max_entries=50, show_spinner="upgrading the database to this specdash's schema…")
def _upgrade(db: str, stamp: tuple) -> None:
    # Once per file state: a file from an older specdash lacks the views and metric macros the pages read.
    upgrade(db)


def recording_banner() -> None:
    """While a sweep records into this file: how far it is, and that refreshing shows its new runs."""
    stand = progress.read(db_path())
    if stand and stand["state"] == progress.RECORDING:
        st.sidebar.progress(stand["done"] / max(stand["total"], 1),
                            text=f"a sweep is recording: {stand['done']} of {stand['total']} runs "
                                 f"(sweep `{stand['sweep_id']}`); refresh to see new runs")


def _empty_state(message: str, db: Path) -> None:
    st.info(f"{message} Record some runs, then refresh this page.")
    st.markdown(f"""\
A small sweep (baselines plus speculative runs for every prompt × draft × k):

```
make run
python -m runner sweep --draft ngram --draft layerskip:20 --k 2,4 --db {db}
```

Another database: `streamlit run dashboard/app.py -- --db PATH`, or set `{DB_ENV}=PATH`.""")


def require_data(db: Path, need_runs: bool = True) -> bool:
    """Show the empty state, or the file's problem, instead of a traceback; True when the page can go on."""
    if not db.exists():
        _empty_state(f"There is no database at `{db}` yet.", db)
        return False
    try:
        _upgrade(str(db), _stamp(db))
        count = load(queries.run_count)
    except StoreError as error:
        st.error(str(error))
        st.caption(f"Point the dashboard at a specdash database: `--db PATH` or `{DB_ENV}=PATH`.")
        return False
    if need_runs and count == 0:
        _empty_state(f"`{db}` holds no runs yet.", db)
        return False
    return True


def unknown_in_url(key: str, options: Sequence[object]) -> list[str]:
    """The values the URL gives `key` that are not among `options`: a widget would drop them without a word."""
    known = {str(option) for option in options}
    return [value for value in st.query_params.get_all(key) if value not in known]


# Every page offers the same filters under the same URL keys, so a view's selection travels from page to page.
FILTERS = ("engine", "target", "draft", "category", "k", "k_policy", "mode", "device", "kernels", "threads",
           "batch_size", "sweep_id", "host", "concurrent_workers")
_KEPT = "_filters"  # session state: the filters picked on any page, carried to the next page's URL
_SYNCED = "_filters_synced_on"  # session state: the page last run again to put carried filters in its URL
_REWRITTEN = "_url_rewritten"  # session state: the raw URL values last given to widgets already drawn


def _label(name: str) -> Callable[[object], str]:
    """How a filter's options read: drafts by technique and spec, sweeps by what they ran and when."""
    if name == "draft":
        return lambda spec: words.draft_name(str(spec))
    if name == "sweep_id":
        names = {row["sweep_id"]: words.sweep_label(row) for _, row in load(filter_queries.sweeps).iterrows()}
        return lambda sweep: names.get(sweep, str(sweep))
    return str


def _unknown_warning(key: str, missing: list[str]) -> None:
    """Name each URL value that matches nothing; a technique's name given for its spec says which spec it is."""
    specs = {technique: kind for kind, technique in words.TECHNIQUES.items()}
    hints = [f"“{value}”" + (f" (that is the technique; its spec is `{specs[value]}`)" if value in specs else "")
             for value in missing]
    st.warning(f"{key}: no speculative run has {', '.join(hints)}; that filter value was left out.")


def _canonical_url(options: dict[str, list], names: Sequence[str]) -> bool:
    """Rewrite each URL value that names an option by its raw form (`?draft=ngram`) to the label its widget shows
    and writes (`prompt lookup (ngram)`), so the address bar names what the filter uses. A widget takes its value
    from the URL its page run started with, so the rewrite takes effect on a run of its own: True when the page
    must run again."""
    rewritten, picks = {}, {}
    for name in names:
        key, label = _URL_KEYS.get(name, name), _label(name)
        by_label = {label(option): option for option in options[name]}
        by_raw = {str(option): label(option) for option in options[name]}
        asked = st.query_params.get_all(key)
        canonical = [value if value in by_label else by_raw.get(value, value) for value in asked]
        if canonical != asked:
            rewritten[key] = canonical
            picks[key] = [by_label[value] for value in canonical if value in by_label]
    if not rewritten:
        st.session_state.pop(_REWRITTEN, None)
        return False
    try:
        st.query_params.update(rewritten)
        return True
    except StreamlitAPIException:
        # The browser stepped back to the address as typed while its widgets are drawn: bound to the URL, they alone
        # may change it, and on such a step they take its values as they are (so none). They are given the options
        # instead, which they take, and write to the URL, on one more run.
        st.session_state.update(picks)
        again = st.session_state.get(_REWRITTEN) != rewritten
        st.session_state[_REWRITTEN] = rewritten
        return again


def _seed(key: str, options: list, label: Callable[[object], str], kept: dict) -> bool:
    """Give the widget of `key` the values picked on the page before, where the URL names none. Names a URL value
    that matches nothing. True when it set a value the URL does not show yet."""
    asked, known = st.query_params.get_all(key), {text for option in options for text in (label(option), str(option))}
    if missing := [value for value in asked if value not in known]:
        _unknown_warning(key, missing)
    if not asked and kept.get(key):
        st.session_state[key] = [value for value in kept[key] if value in options]
        return True
    return False


def filter_widgets(options: dict[str, list], page: str, names: Sequence[str] = FILTERS) -> Filters:
    """Sidebar multiselects bound to the URL, so a copied URL carries them; none picked means all. A URL value
    that names an option by its raw form is rewritten to the option's label (`_canonical_url`); one that matches
    nothing is named in a warning, not dropped silently. A filter picked on another page is picked
    here too: a page opened from the sidebar starts with an empty URL, and a value set before its widget is drawn
    reaches the URL on the page's next run, so the page runs once more."""
    if _canonical_url(options, names):
        st.rerun()
    kept = st.session_state.setdefault(_KEPT, {})
    picked, seeded = {}, False
    for name in names:
        key, label = _URL_KEYS.get(name, name), _label(name)
        seeded |= _seed(key, options[name], label, kept)
        picked[name] = tuple(st.sidebar.multiselect(
            words.FILTER_TITLES.get(name, key), options[name], key=key, bind="query-params", placeholder="all",
            format_func=label, help=words.GLOSSARY.get(name)))
        kept[key] = list(picked[name])
    if seeded and st.session_state.get(_SYNCED) != page:
        st.session_state[_SYNCED] = page
        st.rerun()
    return Filters(**picked)


def carried() -> dict[str, list[str]]:
    """The filters picked so far, as URL parameters (each value as its widget writes it): the sidebar's links to
    the other pages carry them, so every page opens on the same selection."""
    kept = st.session_state.get(_KEPT, {})
    names = {_URL_KEYS.get(name, name): name for name in FILTERS}
    return {key: [_label(names[key])(value) for value in values] for key, values in kept.items() if values}


def filtered(title: str, query: Callable[..., pd.DataFrame]) -> tuple[Filters, pd.DataFrame] | None:
    """A filtered page's start: its title, the sidebar filters and its first query. None, with the reason shown,
    when there is no data or nothing matches (which filter emptied it, `filter_queries.emptied_by`)."""
    st.title(title)
    if not require_data(db_path()):
        return None
    filters = filter_widgets(load(filter_queries.filter_options), title)
    frame = load(query, filters)
    if frame.empty:
        st.info(empty_reason(filters))
        return None
    return filters, frame


def empty_reason(filters: Filters) -> str:
    """Which filter emptied the selection, in words."""
    reason = load(filter_queries.emptied_by, filters)
    if reason is None:
        return "No run with a baseline to measure against matches these filters."
    name, values, before = reason
    shown = ", ".join(f"“{_label(name)(v)}”" for v in values)
    return (f"Nothing matches: {before:,} speculative run{'s' * (before != 1)} matched the filters before "
            f"{words.FILTER_TITLES.get(name, name)} = {shown}, and none after it. Clear that filter, or pick "
            "another value.")
