"""vLLM's faults as one line: a missing environment, a vLLM that does not start (its log's last meaningful line) or
exits mid-sweep, a team's server that runs another config; nothing recorded is lost."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import duckdb
import pytest
from rich.console import Console

from bench.load import free_port
from runner.engine.weights.models import DEFAULT_MODEL
from runner.engines import Workload
from runner.pair_engine import GREEDY
from runner.prompts import Prompt, load_prompts, select_prompts
from runner.sweep.loop import run_sweep
from runner.sweep.plan import SweepConfig, plan
from runner.vllm.client import get
from runner.vllm.drafts import parse
from runner.vllm.engine import VllmEngine
from runner.vllm.process import Settings, VllmError, VllmProcess, last_line, vllm_python


def test_no_environment_names_the_target_that_builds_it(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDASH_VLLM_PYTHON", str(tmp_path / "bin" / "python"))
    with pytest.raises(VllmError, match=r"^no vLLM environment at .*: build it with `make vllm-env`$"):
        vllm_python()


def test_the_log_s_last_meaningful_line_is_its_error(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("INFO starting\nTraceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
                   "ValueError: the model does not exist\n/x.py:3: FutureWarning: deprecated\n"
                   "nanobind: leaked 64 types!\n - leaked type \"x\"\n")
    assert last_line(log) == "ValueError: the model does not exist"


def vllm_interpreter(monkeypatch: pytest.MonkeyPatch, folder: Path, script: str) -> None:
    """vLLM's environment replaced by a shell script that runs `script` (its lines printed to stderr, the log, as
    Python's are) and exits 1."""
    python = folder / "bin" / "python"
    python.parent.mkdir()
    python.write_text(f"#!/bin/sh\n{script}exit 1\n")
    python.chmod(0o755)
    monkeypatch.setenv("SPECDASH_VLLM_PYTHON", str(python))


def test_a_vllm_that_cannot_start_says_why_in_one_line(monkeypatch, tmp_path):
    # An interpreter that fails as vLLM does on a model it cannot load: a traceback, then exit 1.
    vllm_interpreter(monkeypatch, tmp_path, "echo 'INFO starting' >&2\necho 'Traceback (most recent call last):' >&2\n"
                     "echo 'OSError: no-model does not appear to have a file named config.json' >&2\n")
    local = VllmProcess(Settings(str(tmp_path / "no-model")))
    with pytest.raises(VllmError) as refused:
        local.load(None)
    assert str(refused.value) == ("vLLM did not start: OSError: no-model does not appear to have a file named "
                                  f"config.json (log: {local.log})")


def test_a_worker_that_writes_no_answer_is_stopped_with_what_it_wrote(monkeypatch, tmp_path):
    vllm_interpreter(monkeypatch, tmp_path, "read line\necho 'Segmentation fault'\nsleep 60\n")
    local = VllmProcess(Settings("model"))
    with pytest.raises(VllmError, match=r"^vLLM did not start: its worker wrote 'Segmentation fault', not an answer$"):
        local.load(None)
    assert local.exited()


def test_vllm_s_threads_bound_its_numba_pool_too(monkeypatch, tmp_path):
    # vLLM's process reports the thread counts it was given: numba's pool (vLLM's n-gram matcher) included.
    vllm_interpreter(monkeypatch, tmp_path, "echo \"Error: omp $OMP_NUM_THREADS numba $NUMBA_NUM_THREADS bind "
                                            "$VLLM_CPU_OMP_THREADS_BIND\" >&2\n")
    monkeypatch.setenv("NUMBA_NUM_THREADS", "8")
    local = VllmProcess(Settings("model", threads=2))
    with pytest.raises(VllmError, match=r"did not start: Error: omp 2 numba 2 bind 0,1 \(log"):
        local.load(None)


# A worker whose engine is a child that outlives it (SIGTERM ignored, as an engine mid-shutdown would not stop).
STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
OUTLIVED = """import json, os, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "{STUBBORN}"])
open(os.environ["CHILD_PID_FILE"], "w").write(str(child.pid))
sys.stdin.readline()
print(json.dumps({"version": "fake"}), flush=True)
sys.stdin.read()
""".replace("{STUBBORN}", STUBBORN)


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"  # exited, not yet reaped
    except FileNotFoundError:
        return True


def test_stopping_vllm_stops_every_process_it_started(tmp_path, monkeypatch):
    """vLLM can leave a process shutting down after the worker exits; stop() must not return while it still runs, or
    it takes a core from what runs next (the next config's engine, the bench's pass timings)."""
    interpreter = tmp_path / "python"
    interpreter.write_text(f"#!/bin/sh\nexec {sys.executable} -c '{OUTLIVED}'\n")
    interpreter.chmod(0o755)
    monkeypatch.setenv("SPECDASH_VLLM_PYTHON", str(interpreter))
    monkeypatch.setenv("CHILD_PID_FILE", str(tmp_path / "child"))
    process = VllmProcess(Settings("model"))
    assert process.load(None) == "fake"
    child = int((tmp_path / "child").read_text())
    assert not _gone(child)
    process.stop()
    assert _gone(child) and process.process.returncode == 0


FAKE_WORKER = """
import json, os, sys

# runner/vllm/worker.py's protocol; the plain engine dies once it has decoded FAKE_PLAIN_REQUESTS prompts
config, decoded = None, 0
for line in sys.stdin:
    command = json.loads(line)
    if "load" in command:
        config, decoded = command["load"]["speculative_config"], 0
        print(json.dumps({"version": "fake"}), flush=True)
        continue
    replies = []
    for _ in command["generate"]["prompts"]:
        decoded += 1
        if config is None and decoded > int(os.environ["FAKE_PLAIN_REQUESTS"]):
            print("RuntimeError: the engine core died", file=sys.stderr, flush=True)
            os._exit(1)
        k = config and config["num_speculative_tokens"]
        spec = config and {"mean_acceptance_length": 2.0, "draft_acceptance_rate": 1 / k, "num_spec_steps": 1,
                           "acceptance_histogram": [0, 1] + [0] * (k - 1), "num_accepted_draft_tokens": 1,
                           "num_draft_tokens": k, "num_spec_tokens": k, "per_step_accepted": [1],
                           "per_step_drafted": [k]}
        replies.append({"choices": [{"token_ids": [5, 6, 7], "finish_reason": "length"}],
                        "metrics": {"time_to_first_token_ms": 1.0, "generation_time_ms": 2.0,
                                    "speculative_decoding": spec}})
    print(json.dumps({"replies": replies}), flush=True)
"""


# A team's server: vLLM's HTTP side, answering /v1/completions as the real one does (its speculative config given as
# `vllm serve` takes it).
FAKE_SERVER = """
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

port = int(sys.argv[sys.argv.index("--port") + 1])
spec_at = sys.argv.index("--speculative-config") + 1 if "--speculative-config" in sys.argv else None
config = json.loads(sys.argv[spec_at]) if spec_at else None


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def send(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.send({"data": [{"id": "fake-model"}]} if self.path == "/v1/models" else {"version": "fake"})

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        spec = config and {"mean_acceptance_length": 2.0, "draft_acceptance_rate": 0.25, "num_spec_steps": 1,
                           "acceptance_histogram": [0, 1] + [0] * (config["num_speculative_tokens"] - 1),
                           "num_accepted_draft_tokens": 1, "num_draft_tokens": config["num_speculative_tokens"],
                           "num_spec_tokens": config["num_speculative_tokens"], "per_step_accepted": [1],
                           "per_step_drafted": [config["num_speculative_tokens"]]}
        self.send({"choices": [{"token_ids": [5, 6, 7], "finish_reason": "length"}],
                   "metrics": {"time_to_first_token_ms": 1.0, "generation_time_ms": 2.0, "speculative_decoding": spec}})


HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def test_a_vllm_that_dies_mid_sweep_leaves_error_runs_and_the_sweep_resumes(monkeypatch, tmp_path):
    """A stand-in for vLLM's worker (exact counts; the real one is tests/vllm/test_real_vllm.py) whose plain engine
    dies on its third request: the warm-up and the first prompt are answered, the second prompt's run is an error
    run, the next config starts a new process, nothing recorded is lost, and the resumed sweep records the missing
    run."""
    (tmp_path / "fake.py").write_text(FAKE_WORKER)
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} {tmp_path / 'fake.py'} \"$@\"\n")
    python.chmod(0o755)
    monkeypatch.setenv("SPECDASH_VLLM_PYTHON", str(python))
    monkeypatch.setenv("FAKE_PLAIN_REQUESTS", "2")
    db = tmp_path / "runs.duckdb"
    config = SweepConfig(target=DEFAULT_MODEL, drafts=(parse("ngram:2"),), ks=(3,), decodings=(GREEDY,),
                         prompts=tuple(select_prompts(load_prompts(), ["code"], 2)), max_new_tokens=3, seed=0, db=db,
                         device="cpu", dtype="float32", threads=1, engine="vllm")
    sweep_id, recorder = run_sweep(config, Console(quiet=True))
    [error] = recorder.errors
    assert error.split(": ", 1)[1].startswith(
        "VllmError: vLLM did not decode the request: RuntimeError: the engine core died (log: ")
    def runs() -> list[tuple]:
        with duckdb.connect(str(db), read_only=True) as con:
            return con.execute("SELECT prompt_id, draft, status, lossless, engine_version FROM runs "
                               "ORDER BY draft, prompt_id, status DESC").fetchall()
    assert runs() == [("code-01", "ngram:2", "ok", True, "fake"), ("code-02", "ngram:2", "ok", None, "fake"),
                      ("code-01", "none", "ok", None, "fake"), ("code-02", "none", "error", None, "fake")]
    run_sweep(replace(config, sweep_id=sweep_id), Console(quiet=True))
    assert runs() == [("code-01", "ngram:2", "ok", True, "fake"), ("code-02", "ngram:2", "ok", None, "fake"),
                      ("code-01", "none", "ok", None, "fake"), ("code-02", "none", "ok", None, "fake"),
                      ("code-02", "none", "error", None, "fake")]



def test_a_server_a_team_runs_is_reached_at_its_url_and_held_to_the_cells_config(tmp_path):
    """`--engine vllm:<url>`: its model and version read from it; a speculative server records the draft's cells and
    refuses the plain ones in one line (it cannot decode plainly), and a k other than its own."""
    (tmp_path / "fake.py").write_text(FAKE_SERVER)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = json.dumps({"method": "ngram", "num_speculative_tokens": 3})
    server = subprocess.Popen([sys.executable, str(tmp_path / "fake.py"), "--port", str(port), "--speculative-config",
                               config])
    try:
        for _ in range(100):
            with contextlib.suppress(VllmError):
                get(url, "/version")
                break
            time.sleep(0.1)
        db = tmp_path / "runs.duckdb"
        sweep = SweepConfig(target=DEFAULT_MODEL, drafts=(parse("ngram:2"),), ks=(3, 2), decodings=(GREEDY,),
                            prompts=tuple(select_prompts(load_prompts(), ["code"], 1)), max_new_tokens=3, seed=0,
                            db=db, device="cpu", dtype="float32", threads=1, engine=f"vllm:{url}")
        run_sweep(sweep, Console(quiet=True))
    finally:
        server.kill()
        server.wait()
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT draft, k, status, error, engine FROM runs ORDER BY draft, k").fetchall() == [
            ("ngram:2", 2, "error", f"VllmError: the server at {url} drafts k = 3, not the cell's 2", "vllm"),
            ("ngram:2", 3, "ok", None, "vllm"),
            ("none", None, "error", f"VllmError: the server at {url} decodes speculatively (k = 3): it cannot "
                                    "record plain decoding", "vllm")]


def test_a_config_vllm_does_not_start_is_tried_once_and_its_cells_are_error_runs(monkeypatch, tmp_path):
    """A config vLLM does not start with makes every cell of that config an error run with the log's reason, after
    one try, and the sweep goes on to the next config, in a new process."""
    starts = tmp_path / "starts"
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nread line\necho \"$line\" >> {starts}\necho 'RuntimeError: no CPU KV cache' >&2\n"
                      "exit 1\n")
    python.chmod(0o755)
    monkeypatch.setenv("SPECDASH_VLLM_PYTHON", str(python))
    db = tmp_path / "runs.duckdb"
    config = SweepConfig(target=DEFAULT_MODEL, drafts=(parse("ngram:2"),), ks=(2, 3), decodings=(GREEDY,),
                         prompts=tuple(select_prompts(load_prompts(), ["code"], 2)), max_new_tokens=3, seed=0, db=db,
                         device="cpu", dtype="float32", threads=1, engine="vllm")
    run_sweep(config, Console(quiet=True))
    lines = starts.read_text().splitlines()
    # plain, then k = 2, then k = 3: one start each, not one per prompt
    assert [json.loads(line)["load"]["speculative_config"] for line in lines] == [
        None, {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2, "prompt_lookup_min": 1},
        {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2, "prompt_lookup_min": 1}]
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT draft, k, count(*), any_value(error), count(DISTINCT error) FROM runs "
                           "GROUP BY draft, k ORDER BY draft, k").fetchall()
    reason = "VllmError: vLLM did not start: RuntimeError: no CPU KV cache (log: "
    assert [(d, k, n, distinct) for d, k, n, _, distinct in rows] == [("ngram:2", 2, 2, 1), ("ngram:2", 3, 2, 1),
                                                                     ("none", None, 2, 1)]
    assert all(error.startswith(reason) for *_, error, _ in rows)


def test_vllm_here_serves_the_sweep_s_longest_sequence_and_a_longer_prompt_is_refused():
    engine = VllmEngine(DEFAULT_MODEL, None, 1, 16, 0)
    assert engine.context == 8192  # SmolLM2's own positions, as our engine runs it
    prompts = tuple(select_prompts(load_prompts(), ["code", "summary"], 1))
    longest = max(len(engine.prompt_ids(p)) for p in prompts)
    engine.prepare(Workload(prompts, (), (4,), (GREEDY,)))
    assert engine.longest == longest + 16 + 4  # its engines' max_model_len: room for the last step's 4 drafts
    long = Prompt(id="long-1", category="code", text="word " * 9000)
    with pytest.raises(ValueError, match=r'^prompt "long-1" \([\d,]+ tokens\) \+ max-new-tokens \(16\) exceeds the '
                                         r"model's context of 8,192 tokens; nothing is truncated"):
        engine.prepare(Workload((*prompts, long), (), (4,), (GREEDY,)))


def test_vllm_here_runs_plain_first_and_prompt_lookup_last_and_a_bad_head_waits_for_its_cell(tmp_path):
    """Prompt lookup's configs go last (vLLM's process cannot make an engine after one of theirs); a head whose config
    cannot be read does not stop the others: its cells stay in the plan's order, to fail one by one when they run."""
    bad = tmp_path / "head"
    bad.mkdir()
    (bad / "config.json").write_text("{")
    head = str(Path(__file__).resolve().parents[2] / "heads" / "smollm2-135m")
    config = SweepConfig(target=DEFAULT_MODEL, drafts=(parse("ngram:2"), parse(f"eagle:{head}"), parse(f"eagle:{bad}")),
                         ks=(2, 3), decodings=(GREEDY,), prompts=tuple(select_prompts(load_prompts(), ["code"], 1)),
                         max_new_tokens=3, seed=0, db=tmp_path / "runs.duckdb", device="cpu", dtype="float32",
                         threads=1, engine="vllm")
    engine = VllmEngine(DEFAULT_MODEL, None, 1, 3, 0)
    order = [(cell.draft.text, cell.k) for cell in engine.schedule(list(plan(config)))]
    assert order == [("none", None), (f"eagle:{head}", 2), (f"eagle:{head}", 3), (f"eagle:{bad}", 2),
                     (f"eagle:{bad}", 3), ("ngram:2", 2), ("ngram:2", 3)]
