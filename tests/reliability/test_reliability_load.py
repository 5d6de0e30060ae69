"""Twenty browser sessions open the Overview of one `streamlit run` at once: every one renders, none errors.

The work is bench/load.py's (run it for the p50/p95 figures); this bounds it and asserts no errors, not times.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench.load import CHROMIUM, open_sessions, serve, summary
from tests.helpers.browser import TEST_LAUNCH_ARGS
from tests.helpers.dashboard_fixtures import build

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                reason=f"no Chromium headless shell at {CHROMIUM} (`make browser` installs it)")
SESSIONS = 20
# Only a hang guard: on an idle 2-core machine the twenty render in about a minute (the pages take most of the CPU),
# on a busy one several times that; a session still not rendered after this long is hung.
HANG_S = 900


def test_twenty_concurrent_sessions_render_the_overview_without_errors(tmp_path):
    db = build(tmp_path / "runs.duckdb")
    with serve(db, tmp_path / "streamlit.log") as url:
        open_sessions(url, 1, timeout_s=HANG_S, args=TEST_LAUNCH_ARGS)  # the first session pays for the imports
        results = open_sessions(url, SESSIONS, timeout_s=HANG_S, args=TEST_LAUNCH_ARGS)
    print(f"\nload: {summary(results)}", file=sys.stderr)
    assert len(results) == SESSIONS
    assert [r for r in results if r.error] == []
