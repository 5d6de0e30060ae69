"""One writer that attaches a DuckDB file to an in-memory DuckDB, inserts and detaches, against reader
processes that open the file read-only and query it, all for a while; prints each one's counts.

`python bench/lock_race.py [--seconds 60] [--readers 4] [--no-checkpoint]`: without the CHECKPOINT before the
DETACH (as runner/store/connect.py does it), readers intermittently fail with "Could not read enough bytes".
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import duckdb


def writer(path: str, seconds: float, checkpoint: bool) -> Counter:
    counts: Counter = Counter()
    memory = duckdb.connect(":memory:")
    end, i = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        cursor, i = memory.cursor(), i + 1
        try:
            cursor.execute(f"ATTACH '{path}' AS w{i}")  # as runner/store/connect.py's _Attachment does it
            cursor.execute(f"USE w{i}")
            cursor.execute("INSERT INTO t SELECT range, repeat('x', 200) FROM range(20)")
            if checkpoint:
                cursor.execute(f"CHECKPOINT w{i}")
            cursor.execute("USE memory")
            cursor.execute(f"DETACH w{i}")
            counts["writes"] += 1
        except duckdb.Error as error:
            counts["locked" if "lock" in str(error).lower() else f"error: {str(error)[:90]}"] += 1
        finally:
            cursor.close()
    return counts


def reader(path: str, seconds: float) -> Counter:
    counts: Counter = Counter()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            with duckdb.connect(path, read_only=True) as con:
                con.execute("SELECT count(*), sum(length(b)) FROM t").fetchall()
            counts["reads"] += 1
        except duckdb.Error as error:
            counts["locked" if "lock" in str(error).lower() else f"error: {str(error)[:90]}"] += 1
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--readers", type=int, default=4)
    parser.add_argument("--no-checkpoint", action="store_true")
    parser.add_argument("--role", choices=["writer", "reader"], help=argparse.SUPPRESS)
    parser.add_argument("--db", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role:
        counts = (writer(args.db, args.seconds, not args.no_checkpoint) if args.role == "writer"
                  else reader(args.db, args.seconds))
        print(f"{args.role}: {dict(counts)}", flush=True)
        return
    with tempfile.TemporaryDirectory() as folder:
        db = str(Path(folder) / "race.duckdb")
        with duckdb.connect(db) as con:
            con.execute("CREATE TABLE t (a INTEGER, b TEXT)")
        common = [sys.executable, __file__, "--db", db, "--seconds", str(args.seconds)]
        procs = [subprocess.Popen([*common, "--role", "writer", *(["--no-checkpoint"] * args.no_checkpoint)])]
        procs += [subprocess.Popen([*common, "--role", "reader"]) for _ in range(args.readers)]
        for proc in procs:
            proc.wait()


if __name__ == "__main__":
    main()
