"""specdash dashboard: `streamlit run dashboard/app.py [-- --db runs.duckdb]` (or set SPECDASH_DB).

The router: page config, the navigation, and where the database is. Each page is its own file so that every page
keeps its URL (/ for the Overview, /compare, /replay, /bench, /trained, /sql, /spec-bench, /batches) and its state in
the query string. With a login configured (see dashboard/login.py) nothing of the database is read before the gate
lets the user in.
"""

import sys
from pathlib import Path

# `streamlit run` puts this file's folder on sys.path, not the project root that holds `runner`.
ROOT = str(Path(__file__).resolve().parent.parent)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import streamlit as st  # noqa: E402

from dashboard import common, login  # noqa: E402

st.set_page_config(page_title="specdash", page_icon="⚡", layout="wide")
may_read = login.gate()
# Behind the gate too the navigation is made, hidden, so the URL keeps the page it names until after the login.
page = st.navigation([
    st.Page("overview.py", title="Overview", icon=":material/monitoring:", url_path="overview", default=True),
    st.Page("compare.py", title="Compare drafts", icon=":material/leaderboard:", url_path="compare"),
    st.Page("replay.py", title="Run replay", icon=":material/replay:", url_path="replay"),
    st.Page("bench_page.py", title="Benchmark", icon=":material/speed:", url_path="bench"),
    st.Page("trained.py", title="Trained drafts", icon=":material/model_training:", url_path="trained"),
    st.Page("sql_page.py", title="SQL", icon=":material/database:", url_path="sql"),
    st.Page("spec_bench_page.py", title="Spec-Bench · SPEED-Bench", icon=":material/table_chart:",
            url_path="spec-bench"),
    st.Page("batches_page.py", title="Batches", icon=":material/stacks:", url_path="batches"),
], position="sidebar" if may_read else "hidden")
if may_read:
    st.sidebar.caption(f"database: `{common.db_path()}`")
    common.recording_banner()
    page.run()
