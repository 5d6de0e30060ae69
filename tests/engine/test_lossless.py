"""Greedy lossless, honestly classified: a mismatch is a numeric tie or a real divergence, recorded with where
it happened and how close the target's choice was, and shown as such by the sweep and the dashboard."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from runner import cli, report
from runner.engine.round import decode, lossless
from runner.engine.round.decode import generate
from runner.engine.round.decoding_rule import Decoding
from runner.engine.round.draft import NoDraft
from runner.engine.round.sampling import accept_greedy
from runner.engine.weights import models
from runner.records import Divergence
from runner.store import run_facts
from tests.dashboard.test_dashboard_app import app, metrics
from tests.helpers.dashboard_fixtures import build
from tests.helpers.families import BY_NAME, prompt_text, save

GREEDY = Decoding("greedy", 0.0, 1.0)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save(BY_NAME["llama"], tmp_path_factory.mktemp("llama"), 4, 300, seed=1)


def test_a_swap_between_two_exactly_tied_tokens_is_a_numeric_tie_and_any_other_is_real(llama_dir):
    target = models.load(str(llama_dir))
    prompt = tuple(models.encode_chat(target, prompt_text(12, 3)))
    head = target.model.lm_head.weight
    plain = generate(target, NoDraft(), list(prompt), None, GREEDY, 6, torch.Generator()).output_tokens
    chosen = plain[2]
    at = plain.index(chosen)  # where `chosen` first wins
    twin = (chosen + 1) % target.vocab_size
    with torch.no_grad():  # two identical rows of the head: the two logits are equal wherever `chosen` wins
        head[twin] = head[chosen]
    baseline = generate(target, NoDraft(), list(prompt), None, GREEDY, 6, torch.Generator()).output_tokens
    assert baseline[:at] == plain[:at] and baseline[at] in (chosen, twin)  # argmax takes the first of the two
    other = twin if baseline[at] == chosen else chosen
    tie = lossless.classify(target, prompt, baseline, baseline[:at] + (other,))
    assert (tie.at, tie.gap, tie.kind) == (at, 0.0, "tie")  # identical rows: a gap of exactly 0
    with torch.inference_mode():  # independently: the hidden state through the head, by hand
        hidden = target.model.model(input_ids=torch.tensor([prompt + baseline[:at]])).last_hidden_state[0, -1]
        logits = head @ hidden
    by_hand = lossless.TIE_ULPS[torch.float32] * 2.0**-24 * float(logits.abs().max())
    assert tie.tolerance == pytest.approx(by_hand, rel=1e-5)
    worst = int(logits.argmin())
    real = lossless.classify(target, prompt, baseline, baseline[:at] + (worst,))
    top = logits.topk(2).values
    assert real.kind == "real" and real.at == at
    assert real.gap == pytest.approx(float(top[0] - top[1]), abs=1e-4)
    assert lossless.classify(target, prompt, baseline, baseline) is None


def test_first_difference_counts_a_shorter_output_as_differing_where_it_ends():
    assert lossless.first_difference((1, 2, 3), (1, 2, 3)) is None
    assert lossless.first_difference((1, 2, 3), (1, 5, 3)) == 1
    assert lossless.first_difference((1, 2), (1, 2, 3)) == 2


def test_a_wrong_engine_path_is_recorded_and_printed_as_a_real_divergence(llama_dir, tmp_path, monkeypatch):
    # The bug: every round accepts one draft more than the target agreed with.
    monkeypatch.setattr(decode, "accept_greedy", lambda drafts, choices: min(len(drafts), accept_greedy(
        drafts, choices) + 1))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "p0", "category": "poem", "prompt": prompt_text(16, 1)}) + "\n")
    db = tmp_path / "runs.duckdb"
    result = CliRunner().invoke(cli.app, ["sweep", "--target", str(llama_dir), "--draft", "layerskip:1", "--k", "4",
                                          "--prompts", str(prompts), "--max-new-tokens", "16", "--db", str(db)])
    assert result.exit_code == 0, result.stderr
    with duckdb.connect(str(db), read_only=True) as con:
        (spec, base, at, kind, gap, tolerance), = con.execute("""SELECT r.output_tokens, b.output_tokens,
            r.divergence_at, r.divergence, r.divergence_gap, r.divergence_tolerance
            FROM runs r JOIN runs b ON b.run_id = r.baseline_run_id WHERE r.lossless = false""").fetchall()
    assert at == next(i for i, (x, y) in enumerate(zip(spec, base, strict=False)) if x != y)
    assert kind == "real" and gap > tolerance > 0
    assert "LOSSLESS CHECK FAILED, a real divergence from plain greedy in 1 run(s): p0 layerskip:1 k=4 greedy " \
           f"at token {at}" in result.stderr
    assert "real_divergences" in result.stdout  # the sweep's summary counts them per cell
    listed = CliRunner().invoke(cli.app, ["list", "--db", str(db)])
    assert "real_divergences" in listed.stdout


def test_numeric_ties_are_printed_apart_from_real_divergences(capsys):
    report.print_divergences(Console(stderr=True), [("p1 ngram k=2 greedy", Divergence(4, 0.0625, 0.5, "tie"))],
                             "bfloat16")
    err = capsys.readouterr().err
    assert "LOSSLESS CHECK FAILED" not in err
    assert "1 run(s) differ from plain greedy at a numeric tie" in err and "bfloat16" in err
    assert "p1 ngram k=2 greedy at token 4 (top-2 gap 0.0625, tolerance 0.5)" in err


def test_the_dashboard_shows_the_class_of_a_mismatch(monkeypatch, tmp_path):
    db = build(tmp_path / "runs.duckdb")  # its run p1-ls-k4 differs from its baseline at token 6
    with duckdb.connect(str(db)) as con:
        con.execute("UPDATE runs SET divergence = 'tie', divergence_at = 6, divergence_gap = 0.03125, "
                    "divergence_tolerance = 0.25 WHERE run_id = 'p1-ls-k4'")
        run_facts.refresh_all(con)
    at = app(monkeypatch, db, "replay.py", run="p1-ls-k4")
    assert metrics(at)["lossless"] == "✗ tie"
    said = "a numeric tie at token 6: the target's two best logits there are 0.0312 apart (tie tolerance 0.25 in "
    assert any(said in c.value for c in at.caption)
    assert at.warning[0].value.startswith("This output differs from its baseline's from token 6 on. It is " + said)
    at = app(monkeypatch, db, "compare.py")
    assert at.dataframe[0].value.set_index("draft")["lossless"].to_dict() == {
        "prompt lookup (ngram)": "100%", "layer skip (layerskip:2)": "75% (1 numeric tie)"}
    at = app(monkeypatch, db)
    cells = at.dataframe[1].value  # the Overview's table says their class in Compare's words
    poem = cells[(cells["category"] == "poem") & (cells["k"] == 4) & cells["draft"].str.contains("layerskip:2")]
    assert poem["lossless"].tolist() == ["0% (1 numeric tie)"]  # the cell is that one run
