"""Shared by the tests/test_reliability_*.py files: prompt files, sweep processes, invariant checks, readers.

Run as a script it is one of the processes the concurrency and crash tests start:

    python tests/helpers/reliability_helpers.py sweep OUT.json -- <runner sweep arguments>
        the real `python -m runner sweep`, counting the store's lock retries and spills into OUT.json; each
        wait of the store on a locked file is also one line of OUT.json.waits as it happens, and with
        PAUSE_AFTER=n and GO=path in the environment it stops after its n-th write (creating OUT.json.paused)
        until `path` exists, so a test can act at an exact point of the sweep;
    python tests/helpers/reliability_helpers.py reader dashboard|sql DB STOP OUT.json
        a reader that queries DB in a loop, as the dashboard or `runner sql` does, until the file STOP
        appears; after every pass it publishes what it saw (queries, lock retries, errors, partial runs) in OUT.json;
    python tests/helpers/reliability_helpers.py forks
        imports the runner once, then forks one child per line read from stdin, each running the sweep role as
        above (the line is JSON: out, log, env, args), and prints the child's pid; when a child ends, its exit
        code (negative for a signal) appears in LOG.exit. The crash trials kill these children: each is a whole
        sweep process, without paying again for the imports.

Waiting is on events (a file appears, a count is reached, a process ends), never on elapsed time; HANG_S only
turns a hung child into a failure instead of a hung test run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import duckdb

ROOT = Path(__file__).resolve().parents[2]
CATEGORIES = ("code", "summary", "poem")
# The readers' wait for a write, the writer's own bound rather than the pages' 10 s (READ_BOUND_S in
# runner/store/connect.py): under a whole test suite on a slow 2-core host, a reader once waited past 10 s for the
# file (max_open_s in a reader's report shows the longest wait). A starved reader still fails.
READ_BOUND_S = 30.0
# A run whose rounds are not all there: what a reader must never see. Also rounds without their run.
PARTIAL_RUNS = """SELECT
    (SELECT count(*) FROM runs r WHERE status = 'ok'
        AND n_rounds <> (SELECT count(*) FROM rounds WHERE run_id = r.run_id)) AS partial,
    (SELECT count(*) FROM rounds WHERE run_id NOT IN (SELECT run_id FROM runs)) AS orphan_rounds,
    (SELECT count(*) FROM runs) AS runs"""
CELLS = "SELECT prompt_id, draft, k, mode FROM runs WHERE sweep_id = ? AND status = 'ok'"


def write_prompts(path: Path, n: int) -> Path:
    """n short prompts spread over the three categories."""
    lines = [json.dumps({"id": f"p{i:02d}", "category": CATEGORIES[i % 3],
                         "prompt": f"Prompt {i}: write one short line about {CATEGORIES[i % 3]}."}) for i in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return path


def planned_cells(n_prompts: int, drafts: list[str], ks: list[int]) -> list[tuple]:
    """What a greedy sweep over write_prompts(n_prompts) must record: a baseline and every draft × k per prompt."""
    cells = []
    for i in range(n_prompts):
        cells.append((f"p{i:02d}", "none", None, "greedy"))
        cells += [(f"p{i:02d}", draft, k, "greedy") for draft in drafts for k in ks]
    return cells


def sweep_args(target: Path, db: Path, prompts: Path, drafts: list[str], ks: list[int]) -> list[str]:
    drafts_args = [arg for draft in drafts for arg in ("--draft", draft)]
    return ["--target", str(target), *drafts_args, "--k", ",".join(map(str, ks)), "--prompts", str(prompts),
            "--max-new-tokens", "4", "--db", str(db)]


def child_env() -> dict[str, str]:
    """One torch thread per process: with two, the tiny model's passes are ~5x slower on a busy 2-core box."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


def query(db: Path, sql: str, params: list | None = None) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql, params or []).fetchall()


def sweep_ids(db: Path) -> list[str]:
    return [s for (s,) in query(db, "SELECT DISTINCT sweep_id FROM runs ORDER BY ALL")]


HANG_S = 1800  # a guard against a hung child process, far beyond any honest run: not a speed limit


def wait_until(condition: Callable[[], bool], *alive: subprocess.Popen, what: str, poll_s: float = 0.05) -> None:
    """Poll until `condition` holds; fail if a process in `alive` exits first, or after HANG_S."""
    hung = time.monotonic() + HANG_S
    while not condition():
        for proc in alive:
            if proc.poll() is not None:
                raise AssertionError(f"{what}: a child process exited first (code {proc.returncode})")
        if time.monotonic() > hung:
            raise AssertionError(f"{what}: still waiting after {HANG_S} s, the child process hangs")
        time.sleep(poll_s)


def line_count(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def start_script(role: str, *args: str, log: Path) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), role, *args], cwd=ROOT,
                                env=child_env(), stdout=out, stderr=subprocess.STDOUT)


class Forked:
    """A sweep forked by `forks`: pid, poll, returncode, wait and kill, as a subprocess.Popen has them."""

    def __init__(self, pid: int, log: Path):
        self.pid, self.exit_file, self.returncode = pid, log.with_name(log.name + ".exit"), None

    def poll(self) -> int | None:
        if self.returncode is None and self.exit_file.exists():
            self.returncode = int(self.exit_file.read_text())
        return self.returncode

    def wait(self) -> int:
        wait_until(lambda: self.poll() is not None, what=f"forked sweep {self.pid} to end", poll_s=0.01)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            os.kill(self.pid, signal.SIGKILL)  # a child that already ended is a zombie until reaped: no error


class ForkServer:
    """`forks` running, as a context manager; fork(out, log, env, args) starts one sweep and returns its Forked."""

    def __init__(self, log: Path):
        with log.open("w") as out:
            self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "forks"], cwd=ROOT,
                                         env=child_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=out, text=True)

    def fork(self, out: Path, log: Path, env: dict[str, str], args: list[str]) -> Forked:
        self.proc.stdin.write(json.dumps({"out": str(out), "log": str(log), "env": env, "args": args}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"the fork server exited (code {self.proc.wait()})")
        return Forked(int(line), log)

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *_exc) -> None:
        self.proc.stdin.close()  # the server ends once its stdin does
        self.proc.wait(timeout=HANG_S)


# --- the two script roles ------------------------------------------------------------------------------------


def _counting_sweep(out: Path, argv: list[str]) -> int:
    """`runner sweep argv`, with every open_db/write_run of the store counted."""
    from runner import cli
    from runner.store import connect, pending
    from runner.sweep import recorder as run  # where a sweep writes its runs

    counts = {"writes": 0, "write_retries": 0, "read_opens": 0, "read_retries": 0, "spills": 0,
              "max_write_s": 0.0, "exit_code": None}
    real_open, real_write, real_spill = connect.open_db, run.write_run, pending.spill

    def open_db(db_path, *, read_only, bound_s=30.0, config=None):
        con, retries = real_open(db_path, read_only=read_only, bound_s=bound_s, config=config)
        if read_only:
            counts["read_opens"] += 1
            counts["read_retries"] += retries
        return con, retries

    def write_run(db_path, record, lock_timeout_s=30.0):
        started = time.monotonic()
        retries = real_write(db_path, record, lock_timeout_s)
        counts["writes"] += 1
        counts["write_retries"] += retries
        counts["max_write_s"] = max(counts["max_write_s"], time.monotonic() - started)
        return retries

    def spill(db_path, record):
        counts["spills"] += 1
        real_spill(db_path, record)

    waits = out.with_name(out.name + ".waits")
    pause_after, go = int(os.environ.get("PAUSE_AFTER", "0")), os.environ.get("GO")

    class StoreClock:  # the store's clock, with every wait on a locked file published as it happens
        monotonic = staticmethod(time.monotonic)

        @staticmethod
        def sleep(seconds: float) -> None:
            with waits.open("a") as file:
                file.write(f"{seconds}\n")
            time.sleep(seconds)

    def write_then_maybe_pause(db_path, record, lock_timeout_s=30.0):
        retries = write_run(db_path, record, lock_timeout_s)
        if counts["writes"] == pause_after:
            out.with_name(out.name + ".paused").touch()
            while not Path(go).exists():
                time.sleep(0.01)
        return retries

    # Where each is looked up: the store's reads and writes open through connect; the sweep writes its runs.
    connect.open_db, run.write_run, pending.spill = open_db, write_then_maybe_pause, spill
    connect.time = StoreClock
    sys.argv = ["runner", "sweep", *argv]
    try:
        cli.main()
        counts["exit_code"] = 0
    except SystemExit as exit_:
        counts["exit_code"] = exit_.code if isinstance(exit_.code, int) else 1
    finally:
        out.write_text(json.dumps(counts))
    return counts["exit_code"]


def _fork_sweeps() -> int:
    """The `forks` role: one import of the runner, then a forked sweep per line of stdin (see the docstring)."""
    from runner.cli import decoding  # noqa: F401 - what every child imports first; torch runs nothing yet: safe to fork

    def reap(_signum, _frame) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if not pid:
                return
            log = logs.pop(pid)
            publish(log.with_name(log.name + ".exit"), os.waitstatus_to_exitcode(status))

    logs: dict[int, Path] = {}
    signal.signal(signal.SIGCHLD, reap)
    for line in sys.stdin:
        job = json.loads(line)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})  # reaped only once its log is known
        pid = os.fork()
        if pid == 0:
            _run_forked(job)
        logs[pid] = Path(job["log"])
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        print(pid, flush=True)
    return 0


def _run_forked(job: dict) -> None:
    """In the child: its environment and stderr, then the sweep role; never returns."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
    code = 1
    try:
        os.environ.update(job["env"])
        with open(job["log"], "w") as err, open(os.devnull, "w") as null:
            os.dup2(err.fileno(), 2)
            os.dup2(null.fileno(), 1)
        code = _counting_sweep(Path(job["out"]), job["args"])
    except BaseException:  # noqa: BLE001 - the child's error goes to its log, as a process's would
        import traceback
        traceback.print_exc()
    finally:
        sys.stderr.flush()
        os._exit(code)


def _dashboard_reads(db: Path, seen: dict) -> None:
    """What the Overview and the Replay pages read, one short connection per query function, as the app does."""
    from dashboard import filter_queries, queries
    from runner.store import metrics

    if queries.read(db, queries.run_count) == 0:
        return
    filters = metrics.Filters()
    for fn in (filter_queries.filter_options, queries.comparable_cells, queries.verify_growth,
               metrics.draft_categories, metrics.formula_over_k):
        queries.read(db, fn, *([] if fn is filter_queries.filter_options else [filters]))
        seen["queries"] += 1
    queries.read(db, queries.runs, filters, 1000)
    seen["queries"] += 1
    choices = queries.read(db, queries.run_choices, 1000)
    ok = choices[choices["status"] == "ok"]
    if len(ok):
        newest = ok["run_id"].iloc[0]

        def replay(con: duckdb.DuckDBPyConnection) -> tuple[int, int]:
            return int(queries.run_detail(con, newest)["n_rounds"].iloc[0]), len(queries.run_rounds(con, newest))

        n_rounds, rounds = queries.read(db, replay)
        seen["partial"] += int(n_rounds != rounds)
        seen["queries"] += 2
    partial, orphans, runs = queries.read(db, lambda con: con.execute(PARTIAL_RUNS).fetchone())
    seen["partial"] += partial + orphans
    seen["queries"] += 1
    seen["shrank"] += int(runs < seen["runs"])  # committed runs never disappear
    seen["runs"] = max(seen["runs"], runs)


def _sql_reads(db: Path, seen: dict, turn: int) -> None:
    """What `runner sql` and the SQL page run: the examples and the invariant check, through run_query."""
    from runner.store.sql import EXAMPLES, run_query

    if not db.is_file() or db.stat().st_size < 12:
        return
    try:
        partial, orphans, runs = run_query(db, PARTIAL_RUNS, lock_bound_s=READ_BOUND_S).frame.iloc[0].tolist()
    except Exception as error:  # the schema is not there yet: the same as the empty state
        if "does not exist" in str(error):
            seen["not_ready"] += 1
            return
        raise
    seen["partial"] += int(partial) + int(orphans)
    seen["shrank"] += int(runs < seen["runs"])
    seen["runs"] = max(seen["runs"], int(runs))
    run_query(db, list(EXAMPLES.values())[turn % len(EXAMPLES)], lock_bound_s=READ_BOUND_S)
    seen["queries"] += 2


def _reader(kind: str, db: Path, stop_file: Path, out: Path, pause_s: float = 0.02) -> int:
    from dashboard import queries
    from runner.store import connect, sql

    seen = {"kind": kind, "queries": 0, "not_ready": 0, "opens": 0, "retries": 0, "max_open_s": 0.0, "partial": 0,
            "shrank": 0, "runs": 0, "errors": [], "error_count": 0}
    module = connect if kind == "dashboard" else sql  # the dashboard's `queries.read` opens through connect
    real_open = module.open_db
    queries.READ_BOUND_S = READ_BOUND_S

    def open_db(db_path, *, read_only, bound_s=30.0, config=None):
        started = time.monotonic()
        con, retries = real_open(db_path, read_only=read_only, bound_s=bound_s, config=config)
        seen["opens"] += 1
        seen["retries"] += retries
        seen["max_open_s"] = round(max(seen["max_open_s"], time.monotonic() - started), 2)
        return con, retries

    module.open_db = open_db
    turn = 0
    while not stop_file.exists():
        try:
            if not db.exists():
                pass  # the dashboard's empty state: nothing to read yet
            elif kind == "dashboard":
                _dashboard_reads(db, seen)
            else:
                _sql_reads(db, seen, turn)
        except Exception as error:  # noqa: BLE001 - every error a user would see is what this test counts
            seen["error_count"] += 1
            if len(seen["errors"]) < 5:
                seen["errors"].append(f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
        turn += 1
        publish(out, seen)
        time.sleep(pause_s)
    publish(out, seen)
    return 0


def publish(out: Path, seen: dict | int) -> None:
    """Replace OUT.json whole, so the test never reads half a file."""
    partial = out.with_name(out.name + ".tmp")
    partial.write_text(json.dumps(seen))
    os.replace(partial, out)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    role, rest = sys.argv[1], sys.argv[2:]
    if role == "sweep":
        sys.exit(_counting_sweep(Path(rest[0]), rest[2:] if rest[1:2] == ["--"] else rest[1:]))
    if role == "forks":
        sys.exit(_fork_sweeps())
    if role == "reader":
        sys.exit(_reader(rest[0], Path(rest[1]), Path(rest[2]), Path(rest[3])))
    sys.exit(f"unknown role {role}")
