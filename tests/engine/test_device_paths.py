"""The paths that matter on a GPU, checked where they can be on a CPU: host syncs per round, the clock and the
bench timer on the model's own device, warm-up at every k, a device error ending the sweep, the float16 guard,
and a resumed sweep that will not compare with a baseline of other prompt ids, device or dtype."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
import torch
from safetensors.torch import load_file, save_file
from torch.overrides import TorchFunctionMode
from typer.testing import CliRunner

from bench.side_by_side import ForwardTimer
from runner import cli
from runner.engine import pair
from runner.engine.drafters.registry import parse_draft
from runner.engine.drafters.spec import PLAIN
from runner.engine.pair import Pair
from runner.engine.round import decode
from runner.engine.round.clock import Clock
from runner.engine.round.decoding_rule import Decoding
from runner.engine.weights import models
from tests.helpers.families import BY_NAME, prompt_text, save

GREEDY, SAMPLE = Decoding("greedy", 0.0, 1.0), Decoding("sample", 0.8, 0.9)
# Tensor-to-host conversions: each one waits for the device on CUDA (as would a bare synchronize).
TO_HOST = {"tolist", "item", "__int__", "__bool__", "__float__", "__index__", "numpy", "cpu"}


@pytest.fixture(scope="module")
def gemma_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("gemma")
    family = BY_NAME["gemma3"]
    return save(family, root / "target", 6, 300, seed=1), save(family, root / "draft", 2, 300, seed=2)


class HostReads(TorchFunctionMode):
    """Counts every tensor-to-host conversion made inside it, the model's forward included."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in TO_HOST or name == "to" and _moves(args, kwargs or {}):
            self.count += 1
        return func(*args, **(kwargs or {}))


def _moves(args: tuple, kwargs: dict) -> bool:
    """A `.to(...)` that names a device other than the tensor's own: a copy between devices."""
    named = [a for a in (*args[1:], kwargs.get("device")) if isinstance(a, (str, torch.device))]
    return any(torch.device(a) != args[0].device for a in named)


@pytest.mark.parametrize("draft", ["none", "layerskip:2", "model:DRAFT", "ngram"])
@pytest.mark.parametrize("decoding", [GREEDY, SAMPLE], ids=["greedy", "sample"])
def test_a_round_reads_the_device_at_most_twice(gemma_dirs, monkeypatch, draft, decoding):
    target_dir, draft_dir = gemma_dirs
    target = models.load(str(target_dir))
    spec = parse_draft(draft.replace("DRAFT", str(draft_dir)))
    per_round: list[int] = []
    real_round = decode.speculative_round

    def counted(*args, **kwargs):
        with HostReads() as reads:
            timed = real_round(*args, **kwargs)
        per_round.append(reads.count)
        return timed

    monkeypatch.setattr(decode, "speculative_round", counted)
    prompt = models.encode_chat(target, prompt_text(20, 2))
    run = Pair(target, [] if spec.baseline else [spec]).run(spec, prompt, None if spec.baseline else 3, decoding,
                                                            16, seed=0)
    assert len(per_round) == len(run.rounds) >= 4
    # One read: the drafts, the target's choices (or the accepted count and drawn token) and the finite check
    # together. Prompt lookup reads the newly committed text once more.
    assert set(per_round) == {2 if spec.kind == "ngram" else 1}


class FakeCuda:
    """Stands in for torch.cuda on a machine without a GPU: records which device each call names."""

    def __init__(self) -> None:
        self.synchronized: list[torch.device] = []
        self.streams: list[torch.device] = []

    def synchronize(self, device: torch.device | None = None) -> None:
        self.synchronized.append(device)

    def current_stream(self, device: torch.device | None = None) -> str:
        self.streams.append(device)
        return f"stream of {device}"

    class Event:
        def __init__(self, enable_timing: bool) -> None:
            self.stream = None

        def record(self, stream: str | None = None) -> None:
            self.stream = stream

        def elapsed_time(self, end: FakeCuda.Event) -> float:
            return 2.5  # milliseconds


def test_the_clock_and_the_bench_timer_use_the_models_own_gpu(monkeypatch):
    fake = FakeCuda()
    for name in ("synchronize", "current_stream", "Event"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    second = torch.device("cuda", 1)
    clock = Clock(second)
    start, end = clock.mark(), clock.mark()
    assert (start.stream, end.stream) == ("stream of cuda:1", "stream of cuda:1")
    clock.settle()
    assert fake.synchronized == [second] and clock.seconds(start, end) == 0.0025
    timer = ForwardTimer(second)
    model = torch.nn.Linear(2, 2)
    timer.wrap("target", model)
    model(torch.zeros(1, 2))
    assert timer.take() == {"target": (0.0025, 1)}
    assert fake.synchronized == [second, second] and set(fake.streams) == {second}


def test_warm_up_runs_every_verify_width_of_the_sweep(gemma_dirs):
    target = models.load(str(gemma_dirs[0]))
    spec = parse_draft("layerskip:2")
    p = Pair(target, [spec])
    widths: set[int] = set()
    forward = target.model.forward

    def watched(*args, **kwargs):
        widths.add(kwargs["input_ids"].shape[1])
        return forward(*args, **kwargs)

    target.model.forward = watched
    try:
        p.warm_up([PLAIN, spec], models.encode_chat(target, prompt_text(20, 1)), (1, 4, 8), GREEDY, 64)
    finally:
        del target.model.forward
    assert {2, 5, 9} <= widths  # the target verified k+1 tokens at every k, the largest one included


def _prompts(tmp_path: Path, n: int) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "category": "poem", "prompt": prompt_text(16, i)}) + "\n"
                            for i in range(n)))
    return path


def _rows(db: Path, sql: str) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql).fetchall()


def test_a_device_error_stops_the_sweep_and_keeps_what_was_recorded(gemma_dirs, tmp_path, monkeypatch):
    real_run = pair.Pair.run

    def failing(self, spec, prompt, k, decoding, max_new_tokens, seed, *policy):
        if spec.text == "ngram" and k == 2 and max_new_tokens == 8:  # the second prompt's cell, not the warm-up
            failing.calls += 1
            if failing.calls == 2:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return real_run(self, spec, prompt, k, decoding, max_new_tokens, seed, *policy)

    failing.calls = 0
    monkeypatch.setattr(pair.Pair, "run", failing)
    db = tmp_path / "runs.duckdb"
    args = ["sweep", "--target", str(gemma_dirs[0]), "--draft", "ngram", "--k", "1,2", "--prompts",
            str(_prompts(tmp_path, 3)), "--max-new-tokens", "8", "--db", str(db)]
    result = CliRunner().invoke(cli.app, args)
    assert result.exit_code == 1
    # p0: baseline, k=1, k=2; p1: baseline, k=1, then k=2 fails; p2 never starts
    assert _rows(db, "SELECT prompt_id, k, status FROM runs ORDER BY prompt_id, k NULLS FIRST") == [
        ("p0", None, "ok"), ("p0", 1, "ok"), ("p0", 2, "ok"), ("p1", None, "ok"), ("p1", 1, "ok"),
        ("p1", 2, "error")]
    sweep_id = _rows(db, "SELECT DISTINCT sweep_id FROM runs")[0][0]
    assert (f"sweep stopped by a device error (OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB): "
            f"the runs recorded before it are kept; record the rest with --resume {sweep_id}") in result.stderr
    assert CliRunner().invoke(cli.app, [*args, "--resume", sweep_id]).exit_code == 0
    assert _rows(db, "SELECT count(*) FROM runs WHERE status = 'ok'") == [(9,)]


def test_float16_that_overflows_is_refused_in_one_line(tmp_path):
    """Weights beyond float16's range (65,504) load as inf there: the logits are NaN, and the sweep says so."""
    path = save(BY_NAME["llama"], tmp_path / "hot", 2, 300, seed=1)
    weights = load_file(path / "model.safetensors")
    weights["model.embed_tokens.weight"] = weights["model.embed_tokens.weight"] * 1e8
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    db = tmp_path / "runs.duckdb"
    args = ["sweep", "--target", str(path), "--draft", "ngram", "--k", "2", "--prompts", str(_prompts(tmp_path, 1)),
            "--max-new-tokens", "4", "--db", str(db)]
    result = CliRunner().invoke(cli.app, [*args, "--dtype", "float16"])
    assert result.exit_code == 2 and result.stderr.strip() == (
        "error: the target's logits are inf/NaN in float16 (an overflow); use --dtype bfloat16 or float32")
    assert not db.exists()
    assert CliRunner().invoke(cli.app, [*args, "--dtype", "float32"]).exit_code == 0  # the same model in fp32 runs


@pytest.mark.parametrize("change", ["dtype = 'bfloat16'", "device = 'cuda:1'", "prompt_tokens = [1, 2, 3]"])
def test_a_resumed_sweep_reruns_a_baseline_of_other_prompt_ids_device_or_dtype(gemma_dirs, tmp_path, change):
    db = tmp_path / "runs.duckdb"
    args = ["sweep", "--target", str(gemma_dirs[0]), "--draft", "ngram", "--k", "2", "--prompts",
            str(_prompts(tmp_path, 1)), "--max-new-tokens", "6", "--db", str(db)]
    assert CliRunner().invoke(cli.app, args).exit_code == 0
    (sweep_id, old), = _rows(db, "SELECT sweep_id, run_id FROM runs WHERE draft = 'none'")
    with duckdb.connect(str(db)) as con:  # as if recorded elsewhere, and the sweep died before its ngram cell
        con.execute(f"UPDATE runs SET {change} WHERE run_id = ?", [old])
        con.execute("DELETE FROM runs WHERE draft = 'ngram'")
    assert CliRunner().invoke(cli.app, [*args, "--resume", sweep_id]).exit_code == 0
    (new,), = _rows(db, f"SELECT run_id FROM runs WHERE draft = 'none' AND run_id <> '{old}'")
    assert _rows(db, "SELECT baseline_run_id, lossless FROM runs WHERE draft = 'ngram'") == [(new, True)]
