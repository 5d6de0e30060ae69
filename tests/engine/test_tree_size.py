"""A tree given no `:nodes=N` gets the N its pair measures best (runner/engine/tree_size.py), and every run records
the N it drafted (`runs.tree_nodes`)."""

from __future__ import annotations

from dataclasses import replace

import duckdb
from typer.testing import CliRunner

from runner.cli import app
from runner.engine import tree_size
from runner.engine.drafters.registry import parse_draft
from runner.engine.pair import DEFAULT_NODES, Pair
from runner.engine.tree_size import CANDIDATES, GREEDY, Trial, best, line, score
from runner.engine.weights.models import encode_chat
from runner.store.migrations import MIGRATIONS, add_tree_nodes
from runner.store.schema import migrate

PROMPT = "Repeat: red green blue, red green blue, red green blue, red green"


def test_a_trial_is_tokens_per_round_over_the_median_round():
    trial = score(8, [(3, 0.1), (2, 0.2), (1, 0.6)])  # 6 tokens in 3 rounds; the slow round does not decide
    assert (trial.nodes, trial.tau, trial.round_s) == (8, 2.0, 0.2)
    assert trial.rate == 10.0


def test_the_best_n_has_the_most_tokens_per_second_and_a_tie_goes_to_the_smaller():
    assert best([Trial(4, 2.0, 0.25), Trial(8, 3.0, 0.3), Trial(16, 3.3, 0.5)]) == 8  # 8, 10 and 6.6 tokens/s
    assert best([Trial(16, 3.0, 0.3), Trial(4, 2.0, 0.2), Trial(8, 2.5, 0.4)]) == 4  # 10 = 10: the smaller


def test_nodes_that_accept_nothing_more_are_never_chosen_however_fast_they_ran():
    # 8 and 32 nodes drafted the same tree as 4 (the same τ), so their faster rounds were noise; 16 accepted more
    trials = [Trial(4, 2.0, 0.25), Trial(8, 2.0, 0.2), Trial(16, 2.4, 0.3), Trial(32, 2.4, 0.1)]
    assert best(trials) == 4  # 8.0 tokens/s against 16's 8.0: the smaller
    assert best([*trials[:2], Trial(16, 2.4, 0.28), trials[3]]) == 16  # 8.57 against 4's 8.0
    assert best([Trial(4, 1.15, 0.049), Trial(63, 1.15, 0.043)]) == 4
    assert line("ngram-tree", 3, 1, [Trial(4, 2.0, 0.25), Trial(8, 3.0, 0.3)]) == (
        "ngram-tree at k=3: 8 nodes per round, measured (4: 8.0, 8: 10.0 tokens/s of drafting and verifying)")
    assert line("recycling", 2, 4, [Trial(16, 8.0, 0.5)]) == (
        "recycling at k=2, batch 4: 16 nodes per round, measured (16: 16.0 tokens/s of drafting and verifying)")


def test_a_pair_measures_each_tree_and_depth_once_and_drafts_its_best(tiny):
    measured, pinned, chain = parse_draft("ngram-tree"), parse_draft("ngram-tree:3:nodes=5"), parse_draft("ngram")
    pair = Pair(tiny, [measured, pinned, chain])
    prompt = encode_chat(tiny, PROMPT)
    assert pair.nodes_for(measured, 2) == DEFAULT_NODES  # before the warm-up has measured it
    pair.warm_up([measured, pinned, chain], prompt, (2, 3), GREEDY, 40)
    assert set(pair.tree_trials) == {("ngram-tree", 2, 1), ("ngram-tree", 3, 1)}  # the pinned tree, the chain: none
    for (_, k, _), trials in pair.tree_trials.items():
        assert [t.nodes for t in trials] == list(CANDIDATES)
        for trial in trials:  # τ is the greedy run's own: tokens per round at that N, counted again here
            rounds = pair.run(replace(measured, nodes=trial.nodes), prompt, k, GREEDY, tree_size.TOKENS, 0).rounds
            assert trial.tau == sum(r.emitted for r in rounds) / len(rounds)
        chosen = best(trials)
        assert pair.nodes_for(measured, k) == chosen
        run = pair.run(measured, prompt, k, GREEDY, 40, seed=0)
        assert max(r.k for r in run.rounds) <= chosen
    first = dict(pair.tree_trials)
    pair.warm_up([measured], prompt, (2,), GREEDY, 40)
    assert pair.tree_trials == first  # measured once per pair
    assert (pair.nodes_for(pinned, 2), pair.nodes_for(chain, 2)) == (5, None)


def test_at_a_batch_size_the_pair_measures_passes_as_wide_as_the_batchs(tiny):
    """Two copies of the prompt decode alike (greedy): each shared round makes exactly twice a lone round's tokens."""
    measured = parse_draft("recycling")
    pair = Pair(tiny, [measured])
    prompt = encode_chat(tiny, PROMPT)
    pair.warm_up([measured], prompt, (2,), GREEDY, 40, batches=(1, 2))
    alone, together = pair.tree_trials["recycling", 2, 1], pair.tree_trials["recycling", 2, 2]
    assert [t.nodes for t in together] == list(CANDIDATES)
    assert [t.tau for t in together] == [2 * t.tau for t in alone]
    chosen = pair.nodes_for(measured, 2, batch=2)
    assert chosen == best(together)
    runs = pair.run_batch(measured, [prompt, prompt], 2, GREEDY, 40, seed=0)
    assert max(r.k for run in runs for r in run.rounds) <= chosen


def test_a_sweep_records_the_nodes_each_run_drafted(tmp_path, tiny_dir):
    db = tmp_path / "runs.duckdb"
    result = CliRunner().invoke(app, ["sweep", "--target", str(tiny_dir), "--draft", "ngram-tree", "--draft",
                                      "ngram-tree:3:nodes=5", "--draft", "ngram", "--k", "2", "--categories", "code",
                                      "--prompts-per-category", "1", "--max-new-tokens", "12", "--db", str(db)])
    assert result.exit_code == 0, result.output
    with duckdb.connect(str(db), read_only=True) as con:
        rows = dict(con.execute("SELECT draft, tree_nodes FROM runs").fetchall())
        most = con.execute("SELECT max(r.k) FROM rounds r JOIN runs USING (run_id) WHERE draft = 'ngram-tree'")
        drafted = most.fetchone()[0]
    assert rows["none"] is None and rows["ngram"] is None and rows["ngram-tree:3:nodes=5"] == 5
    assert rows["ngram-tree"] in CANDIDATES and drafted <= rows["ngram-tree"]


def test_runs_recorded_before_the_column_get_the_nodes_they_drafted(tmp_path):
    con = duckdb.connect(str(tmp_path / "old.duckdb"))
    migrate(con, to_version=MIGRATIONS.index(add_tree_nodes))  # before tree_nodes
    drafts = [("none", "baseline"), ("ngram", "ngram"), ("eagle-tree:heads/h", "eagle-tree"),
              ("ngram-tree:2:nodes=8", "ngram-tree"), ("recycling:nodes=32", "recycling"), ("lookahead", "lookahead"),
              ("lookahead:3,4,3", "lookahead")]
    for i, (draft, kind) in enumerate(drafts):
        con.execute("INSERT INTO runs (run_id, sweep_id, draft, draft_kind, status) VALUES (?, 's', ?, ?, 'ok')",
                    [str(i), draft, kind])
    migrate(con)
    got = dict(con.execute("SELECT draft, tree_nodes FROM runs").fetchall())
    # 15 was the default then; lookahead drafts G guesses of N - 1: 7 × 4 by default, 3 × 3 at 3,4,3
    assert got == {"none": None, "ngram": None, "eagle-tree:heads/h": 15, "ngram-tree:2:nodes=8": 8,
                   "recycling:nodes=32": 32, "lookahead": 28, "lookahead:3,4,3": 9}
