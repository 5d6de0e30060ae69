"""Training a draft head: the vocabulary, the acceptance counts, a tiny head that learns, its records, and
bad input refused before any model work."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import duckdb
import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from runner.cli import app
from runner.engine.drafters.registry import parse_draft
from runner.engine.pair import Pair
from runner.engine.round.decode import generate
from runner.engine.round.decoding_rule import Decoding
from runner.engine.round.draft import NoDraft
from runner.engine.weights import models
from runner.prompts import load_prompts
from runner.train import fit
from runner.train.data import Context, Sample, answer_batch
from runner.train.fit import TrainConfig, split, vocabulary
from runner.train.pipeline import default_prompts, train_draft
from runner.train.unroll import StepResult, acceptance_counts, batches, fixed_start

GREEDY = Decoding("greedy", 0.0, 1.0)


def test_the_vocabulary_is_the_most_frequent_answer_tokens_then_the_prompts():
    samples = [Sample("a", "c", torch.tensor([9, 9, 8, 5, 5, 5, 4]), torch.zeros(6, 3), 3),
               Sample("b", "c", torch.tensor([8, 4, 4, 2]), torch.zeros(3, 3), 1)]
    # answers: 5 ×3, 4 ×3, 2 ×1; prompts: 9 ×2, 8 ×2 (a tie broken by the lower id)
    ids, coverage = vocabulary(samples, 4, 10)
    assert ids.tolist() == [2, 4, 5, 8] and coverage == 1.0
    ids, coverage = vocabulary(samples, 2, 10)
    assert ids.tolist() == [4, 5] and coverage == 6 / 7


def test_a_position_is_judged_only_after_every_earlier_draft_was_right():
    judged = torch.tensor([[True, True, True, True, False]])
    steps = [StepResult(torch.tensor(0.0), torch.tensor([[True, True, False, True, False]]), judged),
             StepResult(torch.tensor(0.0), torch.tensor([[True, False, True, True, False]]), judged),
             StepResult(torch.tensor(0.0), torch.tensor([[False, True, True, True, False]]), judged)]
    # position 1: 4 judged, 3 right; position 2: the 3 whose first was right, 2 right; position 3: those 2, 1 right
    assert acceptance_counts(steps) == [(4, 3), (3, 2), (2, 1)]


def test_with_the_context_learned_every_token_after_the_fixed_start_is_judged():
    # both samples start with 1 2 3 (a chat template's fixed start); the answers begin at tokens 5 and 4
    one = Sample("a", "c", torch.tensor([1, 2, 3, 9, 8, 7, 6, 5]), torch.zeros(7, 3), 5)
    two = Sample("b", "c", torch.tensor([1, 2, 3, 4, 6, 6, 2, 1]), torch.zeros(7, 3), 4)
    assert fixed_start([one, two]) == 3
    assert fixed_start([one, Sample("c", "c", torch.tensor([1, 2]), torch.zeros(1, 3), 1)]) == 2  # a prefix
    cpu = torch.device("cpu")
    (answers,) = batches([one, two], 100, None, cpu)
    (context,) = batches([one, two], 100, None, cpu, learn_context=True)  # row 0 is `one`
    # index i predicts token i + 2 at step 0 and token i + 3 at step 1; the sample ends at token 7
    assert answers.judged(0)[0].nonzero().flatten().tolist() == [3, 4, 5]  # tokens 5, 6, 7: the answer
    assert context.judged(0)[0].nonzero().flatten().tolist() == [1, 2, 3, 4, 5]  # tokens 3..7
    assert context.judged(1)[0].nonzero().flatten().tolist() == [1, 2, 3, 4]  # tokens 4..7
    assert context.wanted(0)[0, 1].item() == 9 and context.fed(0)[0, 1].item() == 3


def test_the_shipped_training_prompts_are_not_the_built_in_suite_and_every_category_is_held_out():
    shipped = load_prompts(default_prompts())
    builtin = {p.text for p in load_prompts()}
    assert not builtin & {p.text for p in shipped}
    train, heldout = split(shipped)
    assert {p.category for p in heldout} == {p.category for p in shipped} == {"code", "summary", "poem", "general"}
    assert len(train) + len(heldout) == len(shipped) and len(heldout) == sum(
        sum(1 for p in shipped if p.category == c) // fit.HELDOUT_EVERY for c in {p.category for p in shipped})
    # a passage summarised two ways is held out both times, so the held-out score never saw its text
    def passages(prompts: list) -> set[str]:
        return {p.text.split("\n\n", 1)[1] for p in prompts if p.category == "summary"}
    assert passages(heldout) and not passages(heldout) & passages(train)


def pass_with_last_layer(model: torch.nn.Module, tokens: torch.Tensor) -> tuple[object, torch.Tensor]:
    """One plain pass, and the last decoder layer's own output (1, T, H): what index L of L layers reads, before the
    final norm that transformers' hidden_states[L] has been through."""
    seen: list[torch.Tensor] = []
    hook = model.model.layers[-1].register_forward_hook(lambda _m, _a, output: seen.append(output))
    with torch.inference_mode():
        out = model(input_ids=tokens[None], output_hidden_states=True)
    hook.remove()
    return out, seen[0]


def test_the_data_are_the_targets_greedy_answers_with_its_features_at_every_position(tiny):
    """Answered in one batch (rows leaving as they end), checked against one plain pass over each finished text."""
    prompts = [p for p in load_prompts() if p.category == "poem"][:3]
    contexts = [Context(p.id, p.category, 0, models.encode_chat(tiny, p.text)) for p in prompts]
    samples = answer_batch(tiny, contexts, (2, 4), max_new_tokens=9)
    assert [s.prompt_id for s in samples] == [p.id for p in prompts]
    for sample, prompt in zip(samples, prompts, strict=True):
        assert sample.tokens[: sample.answer_start].tolist() == models.encode_chat(tiny, prompt.text)
        assert sample.answer_tokens == 9 or sample.tokens[-1].item() in tiny.eos_ids
        out, last = pass_with_last_layer(tiny.model, sample.tokens)
        greedy = out.logits[0, sample.answer_start - 1 : -1].argmax(-1)
        assert greedy.tolist() == sample.tokens[sample.answer_start :].tolist()
        features = torch.cat([out.hidden_states[2][0], last[0]], dim=-1)[:-1]
        torch.testing.assert_close(sample.features.float(), features, atol=0.05, rtol=0.01)  # stored in bf16


def small_prompts(path: Path) -> Path:
    """20 prompts in two categories: 18 to train on, 2 held out."""
    rows = [{"id": f"{c}-{i}", "category": c, "prompt": f"Tell me about {c} number {i}, please."}
            for c in ("code", "poem") for i in range(10)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def tiny_config(tmp_path: Path, tiny_dir: Path, **changes: object) -> TrainConfig:
    base = TrainConfig(target=str(tiny_dir), out=tmp_path / "head", data=(small_prompts(tmp_path / "p.jsonl"),),
                       max_tokens=400, epochs=3, draft_vocab=256, seed=0, db=tmp_path / "runs.duckdb", unroll=2,
                       lr=3e-3, max_new_tokens=12, batch_size=8, batch_tokens=1024)
    return TrainConfig(**{**base.__dict__, **changes})


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDASH_CACHE", str(tmp_path / "cache"))  # every test makes its own data


def test_a_tiny_head_learns_beyond_the_untrained_one_and_every_epoch_is_recorded(tmp_path, tiny_dir, tiny):
    config = tiny_config(tmp_path, tiny_dir)
    trained = train_draft(config, Console(quiet=True))
    first, best = trained.epochs[0], trained.epochs[trained.saved_epoch]
    assert [e.number for e in trained.epochs] == [0, 1, 2, 3] and trained.saved_epoch > 0
    assert best.rates[0] > first.rates[0] and best.heldout_loss < first.heldout_loss
    con = duckdb.connect(str(config.db), read_only=True)
    row = con.execute("SELECT status, draft, epochs, saved_epoch, train_tokens, heldout_prompts, unroll "
                      "FROM trainings").fetchall()
    assert row == [("ok", f"eagle:{config.out}", 3, trained.saved_epoch, trained.train_tokens, 2, 2)]
    positions = con.execute("SELECT epoch, position, judged, accepted FROM training_positions WHERE category = 'all' "
                            "ORDER BY ALL").fetchall()
    assert positions == [(e.number, j + 1, *e.positions[j]) for e in trained.epochs for j in range(2)]
    # one held-out prompt per category (code-9, poem-9), each scored apart; the pooled rows are their sums
    summed = con.execute("SELECT epoch, position, sum(judged), sum(accepted) FROM training_positions "
                         "WHERE category IN ('code', 'poem') GROUP BY ALL ORDER BY ALL").fetchall()
    assert summed == positions and all(set(e.categories) == {"code", "poem"} for e in trained.epochs)
    losses = con.execute("SELECT train_loss, heldout_loss FROM training_epochs ORDER BY epoch").fetchall()
    assert losses == [(e.train_loss, e.heldout_loss) for e in trained.epochs]
    con.close()
    # the saved head drafts losslessly, and as well as it scored on its held-out prompts
    spec = parse_draft(f"eagle:{config.out}")
    pair = Pair(tiny, [spec])
    prompt = models.encode_chat(tiny, "Tell me about poem number 9, please.")
    expected = generate(tiny, NoDraft(), prompt, 0, GREEDY, 12, torch.Generator()).output_tokens
    run = pair.run(spec, prompt, 2, GREEDY, 12, seed=0)
    assert run.output_tokens == expected and sum(r.accepted for r in run.rounds) > 0


def test_a_head_that_learns_the_context_trains_on_more_positions_and_is_scored_as_before(tmp_path, tiny_dir):
    answers = train_draft(tiny_config(tmp_path, tiny_dir, epochs=1), Console(quiet=True))
    config = tiny_config(tmp_path, tiny_dir, epochs=1, out=tmp_path / "context", learn_context=True)
    context = train_draft(config, Console(quiet=True))
    # the same untrained head on the same held-out answers (evaluation never reads the prompts' own tokens) ...
    assert context.epochs[0] == dataclasses.replace(answers.epochs[0], seconds=context.epochs[0].seconds)
    assert context.epochs[1].positions[0][0] == answers.epochs[1].positions[0][0]
    # ... trained on other positions (the same batches and order, more of each judged)
    assert context.epochs[1].train_loss != answers.epochs[1].train_loss
    con = duckdb.connect(str(config.db), read_only=True)
    assert con.execute("SELECT out_dir, learn_context FROM trainings ORDER BY started_at").fetchall() == [
        (str(tmp_path / "head"), False), (str(config.out), True)]
    con.close()


def test_a_heads_start_is_its_seeds(tiny):
    # every random weight (the fused input's and the layer's own), so one recipe trains one head
    layers = fit.default_layers(tiny.model.config.num_hidden_layers)
    ids, rms = torch.arange(0, 64), torch.ones(len(layers))
    one, again, other = (fit.initial_head(tiny, layers, ids, rms, seed).weights() for seed in (0, 0, 1))
    assert all(torch.equal(one[name], again[name]) for name in one)
    differ = {name for name in one if not torch.equal(one[name], other[name])}
    assert {"fc.weight", "midlayer.self_attn.q_proj.weight"} <= differ


def test_an_interrupted_training_leaves_the_head_directory_as_it_was(tmp_path, tiny_dir, monkeypatch):
    config = tiny_config(tmp_path, tiny_dir, epochs=1)
    train_draft(config, Console(quiet=True))
    before = {f.name: f.read_bytes() for f in config.out.iterdir()}
    calls = []

    def interrupted(*args: object) -> object:
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args)

    real = fit.evaluate
    monkeypatch.setattr(fit, "evaluate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train_draft(tiny_config(tmp_path, tiny_dir, epochs=2, seed=1), Console(quiet=True))
    assert {f.name: f.read_bytes() for f in config.out.iterdir()} == before
    assert [p.name for p in config.out.parent.iterdir() if p.name.startswith(".head")] == []
    con = duckdb.connect(str(config.db), read_only=True)
    assert con.execute("SELECT status FROM trainings ORDER BY started_at").fetchall() == [("ok",), ("interrupted",)]
    con.close()


@pytest.mark.parametrize(("args", "expected"), [
    (["--epochs", "0"], "--epochs must be >= 1, got 0"),
    (["--draft-vocab", "0"], "--draft-vocab must be >= 1, got 0"),
    (["--draft-vocab", "100000"], "--draft-vocab 100000 exceeds the target's vocabulary of 49152"),
    (["--max-tokens", "0"], "--max-tokens must be >= 1, got 0"),
    (["--lr", "0"], "--lr must be > 0, got 0.0"),
    (["--prompts", "FEW"], "needs 10 prompts in a category at least"),
    (["--prompts", "MISSING"], "nowhere.jsonl: no such file"),
    (["--out", "FILE"], "exists and is not a draft head directory"),
    (["--db", "NOTDB"], "not-a-db"),
    (["--target", "/no/such/model"], "no such model directory: /no/such/model"),
    (["--kind", "medusa", "--learn-context"], "--learn-context trains an EAGLE head only (--kind eagle)"),
])
def test_train_draft_refuses_bad_input_before_any_model_loads(tmp_path, tiny_dir, monkeypatch, args, expected):
    def no_loading(*a: object, **k: object) -> None:
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr(models, "load", no_loading)
    (tmp_path / "few.jsonl").write_text(json.dumps({"id": "a", "category": "c", "prompt": "hi"}) + "\n")
    (tmp_path / "file").write_text("x")
    (tmp_path / "not-a-db").write_text("not a database")
    swap = {"FEW": tmp_path / "few.jsonl", "MISSING": tmp_path / "nowhere.jsonl", "FILE": tmp_path / "file",
            "NOTDB": tmp_path / "not-a-db"}
    args = [str(swap.get(a, a)) for a in args]
    base = ["train-draft", "--target", str(tiny_dir), "--out", str(tmp_path / "head"), "--db",
            str(tmp_path / "runs.duckdb")]
    result = CliRunner().invoke(app, base + args)
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert expected in lines[0], lines[0]
    assert not (tmp_path / "head").exists() and not (tmp_path / "runs.duckdb").exists()
