"""Draft-length policies: each policy's k sequence worked by hand on scripted rounds, and lossless for every policy."""

from __future__ import annotations

import duckdb
import pytest
import torch
from typer.testing import CliRunner

from runner.cli import app
from runner.engine.drafters.model import ModelDrafter
from runner.engine.drafters.registry import applies, parse_draft
from runner.engine.pair import Pair
from runner.engine.round.decode import generate
from runner.engine.round.decoding_rule import Decoding
from runner.engine.round.draft import Draft, NoDraft
from runner.engine.round.policies import CAP, FIXED, SLOPE, Auto, Heuristic, VerifyCosts, parse_policy
from runner.engine.weights import models
from runner.records import Round
from tests.engine.test_heads import DRAFT_IDS, published_config, published_tensors, write_head

GREEDY = Decoding("greedy", 0.0, 1.0)
PROMPT = list(range(100, 140)) * 2  # repeats, so prompt lookup finds matches


class Oracle:
    """Knows the target's greedy text: each round proposes the next k true tokens, except that the draft after the
    scripted number of correct ones is wrong (None: all k correct). Logs the k it was asked for."""

    calls = 0
    wants_hidden = ()
    wants_top = 0

    def __init__(self, truth: tuple[int, ...], prompt_length: int, correct: list[int | None]) -> None:
        self.truth, self.start, self.correct = truth, prompt_length, iter(correct)
        self.asked: list[int] = []

    def prefill(self, tokens: torch.Tensor, hidden: torch.Tensor | None, top: torch.Tensor | None) -> None:
        pass

    def propose(self, tokens: torch.Tensor, k: int) -> Draft:
        self.asked.append(k)
        at = tokens.numel() - self.start  # output tokens so far
        drafts = list(self.truth[at : at + k])
        right = next(self.correct)
        if right is not None and right < k:
            drafts[right] = (drafts[right] + 1) % 1000  # the first wrong draft; the rest are thrown
        return Draft(tokens=torch.tensor(drafts, dtype=torch.long), q=None)

    def accepted(self, n: int, hidden: torch.Tensor | None, top: torch.Tensor | None) -> None:
        pass


def plain(target: models.Loaded, n: int) -> tuple[int, ...]:
    return generate(target, NoDraft(), PROMPT, 0, GREEDY, n, torch.Generator()).output_tokens


def test_policies_parse_and_bad_ones_are_refused():
    assert parse_policy("fixed") == FIXED
    assert (parse_policy("heuristic").kind, parse_policy("heuristic").cap) == ("heuristic", CAP)
    assert parse_policy("heuristic:6").cap == 6
    assert parse_policy("confidence:0.4").threshold == 0.4
    assert (parse_policy("auto").kind, parse_policy("auto").cap, parse_policy("auto:6").cap) == ("auto", CAP, 6)
    for bad in ("adaptive", "heuristic:0", "heuristic:x", "confidence", "confidence:1", "confidence:0", "fixed:2",
                "auto:0", "auto:x"):
        with pytest.raises(ValueError, match="unknown k-policy"):
            parse_policy(bad)
    assert not applies(parse_policy("confidence:0.5"), "ngram")
    assert applies(parse_policy("confidence:0.5"), "layerskip") and applies(parse_policy("heuristic"), "ngram")


def test_the_heuristic_schedule_by_hand():
    # start 2, cap 6: +2 after a fully accepted round, −1 otherwise, within [1, 6]; a round with nothing proposed
    # (prompt lookup found no match) leaves k alone
    schedule = Heuristic(start=2, cap=6)
    outcomes = [(2, 2), (4, 4), (6, 6), (6, 1), (5, 0), (0, 0), (4, 3), (3, 0), (2, 0), (1, 0), (1, 1)]
    seen = []
    for proposed, accepted in outcomes:
        seen.append(schedule.next_k())
        schedule.observe(proposed, accepted)
    assert seen == [2, 4, 6, 6, 5, 4, 4, 3, 2, 1, 1]
    assert schedule.next_k() == 3


def timed_round(k: int, accepted: int, draft_s: float, verify_s: float = 0.0) -> Round:
    rejected = int(accepted < k)
    return Round(k, accepted, rejected, k - accepted - rejected, accepted == k, accepted + 1, draft_s, verify_s,
                 (), ())


def test_verify_costs_interpolate_between_measured_widths_and_extrapolate_by_the_slope():
    costs = VerifyCosts()
    for width, seconds in ((1, 0.010), (1, 0.012), (3, 0.016)):
        costs.add(width, seconds)
    assert costs.seconds(1) == pytest.approx(0.011)  # the mean of its rounds
    assert costs.seconds(2) == pytest.approx(0.0135)  # halfway between 11 and 16 ms
    assert costs.seconds(5) == pytest.approx(0.016 * (1 + 2 * SLOPE))  # 2 tokens past the widest measured
    assert costs.seconds(0) == pytest.approx(0.011 * (1 - SLOPE))


def test_the_auto_schedule_by_hand():
    costs = VerifyCosts()
    for width, seconds in ((1, 0.010), (2, 0.013), (3, 0.020)):
        costs.add(width, seconds)
    schedule = Auto(start=3, cap=3, costs=costs)
    assert schedule.next_k() == 3  # nothing measured in this generation yet: the start
    # Round 1 proposes 2 and both are accepted; 1 ms a drafted token. Pooled acceptance (2 + 1) / (2 + 2) = 0.75,
    # worth 2 rounds: r1 = r2 = (1 + 1.5) / 3, r3 = 1.5 / 2. Tokens/s: k=1 (1 + 0.833) / (1 + 10 ms) = 166.7;
    # k=2 (1 + 0.833 + 0.694) / (2 + 13 ms) = 168.5; k=3 (2.528 + 0.521) / (3 + 20 ms) = 132.6: k = 2.
    schedule.observe(2, 2)
    schedule.timed(timed_round(2, 2, 0.002))
    assert schedule.next_k() == 2
    # Round 2: 2 proposed, none accepted. Pooled (2 + 1) / (3 + 2) = 0.6: r1 = (1 + 1.2) / 4 = 0.55,
    # r2 = (1 + 1.2) / 3. k=1: 1.55 / 11 ms = 140.9; k=2: (1.55 + 0.403) / 15 ms = 130.2: k = 1.
    schedule.observe(2, 0)
    schedule.timed(timed_round(2, 0, 0.002))
    assert schedule.next_k() == 1


def test_every_rounds_verify_time_goes_into_the_pairs_costs(tiny):
    spec = parse_draft("ngram")
    pair = Pair(tiny, [spec])
    runs = [pair.run(spec, PROMPT, k, GREEDY, 24, 0) for k in (1, 3)]
    rounds = [r for run in runs for r in run.rounds]
    for width in {r.k for r in rounds}:
        measured = [r.verify_s for r in rounds if r.k == width]
        assert pair.verify_costs.sums[width][1] == len(measured)
        assert pair.verify_costs.seconds(width) == pytest.approx(sum(measured) / len(measured))
    assert sum(rounds for _, rounds in pair.verify_costs.sums.values()) == len(rounds)


@pytest.mark.parametrize(("policy", "correct", "ks", "emitted"), [
    # fixed: k = 3 every round; emitted = accepted + 1
    ("fixed", [None, 1, 0, None], [3, 3, 3, 3], [4, 2, 1, 4]),
    # heuristic from 3, cap 6: all 3 accepted -> 5; all 5 -> 6 (the cap); 2 of 6 -> 5; 0 of 5 -> 4; all 4 -> 6
    ("heuristic:6", [None, None, 2, 0, None], [3, 5, 6, 5, 4], [4, 6, 3, 1, 5]),
])
def test_each_round_gets_the_k_its_policy_gives(tiny, policy, correct, ks, emitted):
    truth = plain(tiny, 48)
    oracle = Oracle(truth, len(PROMPT), correct)
    n = 1 + sum(emitted)  # the prefill's token, then the scripted rounds exactly
    run = generate(tiny, oracle, PROMPT, 3, GREEDY, n, torch.Generator(), parse_policy(policy))
    assert [r.k for r in run.rounds] == oracle.asked == ks
    assert [r.emitted for r in run.rounds] == emitted
    assert run.output_tokens == truth[:n]


@pytest.mark.parametrize(("threshold", "ks"), [
    # The tiny random model's next-token distributions are nearly uniform over 49,152 ids (top probability ~1e-4):
    # above every top probability, each round stops after its first draft; below all of them, it drafts all 4.
    # Drafting for itself, every draft is accepted: 2 tokens a round, then 5; the last round is cut by the budget.
    ("confidence:0.5", [1] * 8 + [0]),
    ("confidence:1e-9", [4, 4, 4, 1]),
])
def test_a_draft_model_stops_where_it_is_unsure(tiny, threshold, ks):
    drafter = ModelDrafter(tiny.model, GREEDY, None, tiny.vocab_size, stop_below=parse_policy(threshold).threshold)
    run = generate(tiny, drafter, PROMPT, 4, GREEDY, 18, torch.Generator(), parse_policy(threshold))
    assert [r.k for r in run.rounds] == ks
    assert all(r.accepted == r.k for r in run.rounds)
    assert run.output_tokens == plain(tiny, 18)


def test_the_confidence_stop_matches_the_targets_own_probabilities(smollm2):
    """Drafting for itself, each round drafts until the first token whose top probability is below t (that one
    included), then the bonus: the k sequence follows from plain decoding's probabilities, computed apart."""
    prompt = models.encode_chat(smollm2, "Write a haiku about rain.")
    n, t, k = 30, 0.6, 4
    out = plain_probabilities(smollm2, prompt, n)
    expected, at = [], 1  # the prefill made token 0; round r drafts output positions at, at+1, …
    while at < n:
        budget_k = min(k, n - at - 1)
        drafted = next((i + 1 for i in range(budget_k) if out[at + i] < t), budget_k)
        expected.append(drafted)
        at += drafted + 1
    drafter = ModelDrafter(smollm2.model, GREEDY, None, smollm2.vocab_size, stop_below=t)
    run = generate(smollm2, drafter, prompt, k, GREEDY, n, torch.Generator(), parse_policy(f"confidence:{t}"))
    assert [r.k for r in run.rounds] == expected
    assert 1 in expected and k in expected  # the threshold did stop some rounds early and not others


def plain_probabilities(target: models.Loaded, prompt: list[int], n: int) -> list[float]:
    """The top probability of the target at each of its n greedy tokens, from transformers' own greedy `generate`
    (its raw logits at every step), which shares none of our decoding code."""
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = target.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                                    output_logits=True, return_dict_in_generate=True)
    assert len(out.logits) == n  # no end of text within n tokens: every round below has its probabilities
    return [torch.softmax(logits[0, : target.vocab_size].float(), -1).max().item() for logits in out.logits]


@pytest.mark.parametrize("policy", ["fixed", "heuristic", "heuristic:3", "auto", "auto:3", "confidence:0.3"])
@pytest.mark.parametrize("draft", ["ngram", "ngram:3:earliest", "ngram:3:longest", "layerskip:1", "model:tiny"])
def test_every_policy_is_lossless_on_a_tiny_model(tiny, tiny_dir, draft, policy):
    spec = parse_draft(draft.replace("tiny", str(tiny_dir)))
    chosen = parse_policy(policy)
    if not applies(chosen, spec.kind):
        with pytest.raises(ValueError, match="needs a draft with probabilities"):
            Pair(tiny, [spec]).run(spec, PROMPT, 2, GREEDY, 8, 0, chosen)
        return
    pair = Pair(tiny, [spec])
    for k in (1, 2, 5):
        assert pair.run(spec, PROMPT, k, GREEDY, 48, 0, chosen).output_tokens == plain(tiny, 48), (draft, k)


@pytest.mark.parametrize(("draft", "policy"), [("ngram", "heuristic"), ("ngram", "auto"), ("layerskip:24", "heuristic"),
                                               ("layerskip:24", "auto"), ("layerskip:24", "confidence:0.4")])
def test_adaptive_policies_are_lossless_on_smollm2(smollm2, draft, policy):
    spec = parse_draft(draft)
    prompt = models.encode_chat(smollm2, "Summarize: the council closed the old bridge for six weeks of repairs.")
    expected = generate(smollm2, NoDraft(), prompt, None, GREEDY, 40, torch.Generator()).output_tokens
    for k in (1, 4):
        assert Pair(smollm2, [spec]).run(spec, prompt, k, GREEDY, 40, 0, parse_policy(policy)).output_tokens \
            == expected, k


def test_a_sweep_compares_policies_and_records_each(tiny_dir, tmp_path):
    """`--k-policy` repeats: every draft × k × policy a draft can follow is recorded with its policy, the pairs it
    cannot follow are named on stderr, every greedy run is lossless, and each heuristic run's recorded k sequence is
    the schedule replayed on its own recorded outcomes (cut by the token budget; prompt lookup may find fewer)."""
    db, n = tmp_path / "runs.duckdb", 24
    result = CliRunner().invoke(app, [
        "sweep", "--target", str(tiny_dir), "--draft", "ngram", "--draft", "layerskip:1", "--k", "1,3",
        "--k-policy", "fixed", "--k-policy", "heuristic:4", "--k-policy", "confidence:0.3", "--categories", "code",
        "--prompts-per-category", "1", "--max-new-tokens", str(n), "--db", str(db)])
    assert result.exit_code == 0, result.stderr
    assert 'skipped: k-policy "confidence:0.3" needs a draft with probabilities' in result.stderr
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT draft, k_policy, count(*), bool_and(lossless) FROM runs GROUP BY ALL ORDER BY ALL"
                       ).fetchall() == [
        ("layerskip:1", "confidence:0.3", 2, True), ("layerskip:1", "fixed", 2, True),
        ("layerskip:1", "heuristic:4", 2, True), ("ngram", "fixed", 2, True), ("ngram", "heuristic:4", 2, True),
        ("none", None, 1, None)]
    rounds = con.execute("""SELECT run_id, draft, r.k AS start, o.k, o.accepted, o.emitted FROM rounds o JOIN runs r
        USING (run_id) WHERE k_policy = 'heuristic:4' ORDER BY run_id, round""").df()
    for _, run in rounds.groupby("run_id"):
        schedule, made = Heuristic(int(run.start.iloc[0]), 4), 1
        for k, accepted, emitted in zip(run.k, run.accepted, run.emitted, strict=True):
            asked = min(schedule.next_k(), n - made - 1)
            assert k == asked if run.draft.iloc[0] == "layerskip:1" else 0 <= k <= asked
            schedule.observe(k, accepted)
            made += emitted


@pytest.mark.parametrize(("threshold", "ks"), [
    # A random head for the tiny model: the target rejects every draft, so each round emits one token and the
    # budget (40 tokens, the prefill's first) leaves round r room for min(k, 38 − r) drafts. Its top probability
    # is below 0.999999 at every draft: each round stops after its first; never below 1e-9: none stops early.
    ("confidence:0.999999", [1] * 38 + [0]),
    ("confidence:1e-9", [4] * 35 + [3, 2, 1, 0]),
])
def test_an_eagle_head_stops_where_it_is_unsure(tiny, tmp_path, threshold, ks):
    head = write_head(tmp_path / "head", published_config(64, 49152, DRAFT_IDS.numel()),
                      published_tensors(64, 49152, DRAFT_IDS, 0))
    spec = parse_draft(f"eagle:{head}")
    run = Pair(tiny, [spec]).run(spec, PROMPT, 4, GREEDY, 40, 0, parse_policy(threshold))
    assert [r.k for r in run.rounds] == ks and all(r.accepted == 0 for r in run.rounds)
    assert run.output_tokens == plain(tiny, 40)
