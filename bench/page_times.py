"""Each dashboard page's first and warm render on a copy of the shipped `runs.duckdb`, every page in a process of
its own (so the first render pays its imports and an empty cache, as a page opened first after `make run` does).

A render is AppTest's run of the router and the page's script (no browser: `bench/first_view.py` times one); a
page other than the Overview is first rendered after the Overview, on which the app opens. The replay opens the
first speculative run. A filter change is the sidebar's category filter set to its first category, on the pages that
have it. Usage: `python bench/page_times.py [--db runs.duckdb] [--repeats 3]`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("overview.py", "compare.py", "replay.py", "bench_page.py", "trained.py", "sql_page.py",
         "spec_bench_page.py", "batches_page.py")

# Run in a fresh interpreter per page: prints {"first": s, "warm": s, "errors": n}.
ONE_PAGE = """
import json, os, sys, time
import duckdb
from streamlit.testing.v1 import AppTest
db, page = sys.argv[1], sys.argv[2]
os.environ["SPECDASH_DB"] = db
at = AppTest.from_file(os.path.join(sys.argv[3], "dashboard", "app.py"), default_timeout=300)
if page != "overview.py":  # the app opens on the Overview, as a browser does; then the page is picked
    at.run()
    at.switch_page(page)
if page == "replay.py":
    with duckdb.connect(db, read_only=True) as con:
        run = con.execute("SELECT min(run_id) FROM runs WHERE draft <> 'none' AND status = 'ok'").fetchone()[0]
    at.query_params["run"] = run
start = time.perf_counter(); at.run(); first = time.perf_counter() - start
start = time.perf_counter(); at.run(); warm = time.perf_counter() - start
filtered = None  # a filter change: the sidebar's category filter set to its first category
picks = [m for m in at.multiselect if m.key == "category" and m.options]
if picks:
    picks[0].set_value([picks[0].options[0]])
    start = time.perf_counter(); at.run(); filtered = time.perf_counter() - start
print(json.dumps({"first": first, "warm": warm, "filter": filtered, "errors": len(at.exception)}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path, default=ROOT / "runs.duckdb")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        db = Path(folder) / "runs.duckdb"
        shutil.copy(args.db, db)  # the pages upgrade an older file in place: the repository's stays as it is
        print(f"{'page':<20} {'first s':>8} {'warm s':>8} {'filter s':>9}  (medians of {args.repeats})")
        for page in PAGES:
            times = [_one(db, page) for _ in range(args.repeats)]
            first, warm = (statistics.median(t[key] for t in times) for key in ("first", "warm"))
            filtered = [t["filter"] for t in times if t["filter"] is not None]
            change = f"{statistics.median(filtered):>9.2f}" if filtered else f"{'–':>9}"
            errors = sum(t["errors"] for t in times)
            print(f"{page:<20} {first:>8.2f} {warm:>8.2f} {change}" + (f"  {errors} exceptions" if errors else ""))


def _one(db: Path, page: str) -> dict:
    out = subprocess.run([sys.executable, "-c", ONE_PAGE, str(db), page, str(ROOT)], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
