"""Medusa heads (`medusa:<head>`, `medusa-tree:<head>`): hand-built heads whose drafts are known, so the hidden
state each head reads and the chain and tree drafted from it are checked exactly; both file layouts and both name
prefixes; every refusal as one line; greedy output equal to plain decoding; sampling exact by χ²."""

from __future__ import annotations

import json
import math
from pathlib import Path

import duckdb
import pytest
import torch
import torch.nn.functional as F
from rich.console import Console
from safetensors.torch import save_file

from runner.engine.drafters.medusa import MedusaDrafter, MedusaTreeDrafter, rank_tree
from runner.engine.drafters.registry import parse_draft
from runner.engine.pair import Pair
from runner.engine.round import sampling, trees
from runner.engine.round.decode import CachedTarget, generate
from runner.engine.round.decoding_rule import Decoding
from runner.engine.round.draft import NoDraft
from runner.engine.weights import medusa_files
from runner.engine.weights.models import Loaded, encode_chat
from runner.train import medusa_fit
from runner.train.data import Sample
from runner.train.medusa_fit import IGNORE
from runner.train.pipeline import train_draft
from tests.end_to_end.test_cli import invoke
from tests.engine.test_trees_sampling import PROMPT, VOCAB, _no_residual, _target
from tests.helpers.laws import pooled_chisquare, two_token_law
from tests.train.test_train import tiny_config

GREEDY = Decoding("greedy", 0.0, 1.0)
FAR = 1000.0  # the bias that makes a block constant: x + SiLU(-x + FAR·e0) = FAR·e0 to fp32 precision


def write(path: Path, tensors: dict[str, torch.Tensor], heads: int, layers: int,
          name: str = medusa_files.SAFETENSORS, prefix: str = "") -> Path:
    """A head directory in the published layout."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"medusa_num_heads": heads, "medusa_num_layers": layers}))
    named = {prefix + k: v.contiguous() for k, v in tensors.items()}
    if name.endswith(".pt"):
        torch.save(named, path / name)
    else:
        save_file(named, path / name)
    return path


def random_heads(heads: int, hidden: int, seed: int, vocab: int | None = None, scale: float = 0.3) -> dict:
    """One block per head with random weights; with `vocab`, an LM head of its own too."""
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for i in range(heads):
        tensors[f"{i}.0.linear.weight"] = torch.randn(hidden, hidden, generator=gen) * scale
        tensors[f"{i}.0.linear.bias"] = torch.randn(hidden, generator=gen) * scale
        if vocab is not None:
            tensors[f"{i}.1.weight"] = torch.randn(vocab, hidden, generator=gen)
    return tensors


def constant_heads(hidden: int, vocab: int, logits: list[dict[int, float]]) -> dict:
    """Heads whose logits are `logits[i]` (0 elsewhere) whatever they read: the block turns any x into FAR·e0
    (SiLU(z) = z for z near FAR), and the LM head reads only that coordinate."""
    tensors = {}
    for i, chosen in enumerate(logits):
        bias = torch.zeros(hidden)
        bias[0] = FAR
        lm = torch.zeros(vocab, hidden)
        for token, logit in chosen.items():
            lm[token, 0] = logit / FAR
        tensors |= {f"{i}.0.linear.weight": -torch.eye(hidden), f"{i}.0.linear.bias": bias, f"{i}.1.weight": lm}
    return tensors


def heads_of(tiny: Loaded, path: Path):
    return medusa_files.load(medusa_files.check(str(path), tiny.model.config), tiny.model.lm_head.weight,
                             tiny.vocab_size, tiny.device, tiny.dtype)


def ready(drafter, target: Loaded, text: str = "Tell me about rivers.") -> torch.Tensor:
    """The drafter after the prefill of a chat prompt and its first new token, as the decode loop leaves it."""
    prompt = torch.tensor(encode_chat(target, text))
    with torch.inference_mode():
        logits, features, _ = CachedTarget(target).prefill(prompt, drafter.wants_hidden, 0)
    tokens = torch.cat([prompt, logits.argmax().view(1)])
    drafter.prefill(tokens, features, None)
    return tokens


class Recording(MedusaDrafter):
    """A chain drafter that keeps (newest committed token, drafts) of every round."""

    def __init__(self, heads) -> None:
        super().__init__(heads)
        self.seen: list[tuple[int, list[int]]] = []

    def propose(self, tokens, k):
        draft = super().propose(tokens, k)
        self.seen.append((int(tokens[-1]), draft.tokens.tolist()))
        return draft


def test_each_head_reads_the_hidden_state_that_made_the_newest_token(tiny, tmp_path):
    # Identity blocks and no LM heads of their own: every head is the target's LM head on what it reads, so it
    # repeats the newest committed token exactly when it reads the state whose logits made that token.
    zeros = {k: torch.zeros_like(v) for k, v in random_heads(3, 64, seed=0).items()}
    drafter = Recording(heads_of(tiny, write(tmp_path / "h", zeros, heads=3, layers=1)))
    prompt = encode_chat(tiny, "Tell me about rivers.")
    run = generate(tiny, drafter, prompt, 3, GREEDY, 24, torch.Generator())
    assert len(drafter.seen) == len(run.rounds) >= 6
    assert all(drafts == [newest] * len(drafts) for newest, drafts in drafter.seen)  # the last rounds: budget left
    assert len(set(run.output_tokens)) > 3  # the newest token changes from round to round: a shift would show
    # After accepted drafts the row that counts is the last kept one (the last accepted draft's), not the root's.
    rows = torch.randn(3, 64, generator=torch.Generator().manual_seed(7))
    drafter.accepted(2, rows, None)
    last = int((tiny.model.lm_head.weight @ rows[2]).argmax())
    assert drafter.propose(torch.tensor([1]), 3).tokens.tolist() == [last] * 3


def test_the_chain_is_each_heads_top_token_in_head_order(tiny, tmp_path):
    logits = [{11: 12.0, 12: 11.0}, {21: 12.5, 22: 10.5}, {31: 11.7, 32: 11.2}]
    drafter = MedusaDrafter(heads_of(tiny, write(tmp_path / "h", constant_heads(64, 49152, logits), 3, 1)))
    tokens = ready(drafter, tiny)
    assert drafter.propose(tokens, 3).tokens.tolist() == [11, 21, 31]  # head 0 drafts first
    assert drafter.propose(tokens, 2).tokens.tolist() == [11, 21]
    assert drafter.propose(tokens, 5).tokens.tolist() == [11, 21, 31]  # no more drafts than heads


def test_the_tree_keeps_the_likeliest_rank_combinations(tiny, tmp_path):
    logits = [{11: 12.0, 12: 11.0, 13: 10.0}, {21: 12.5, 22: 10.5}, {31: 11.7, 32: 11.2}]
    # each head's law, by hand: e^logit over the candidates plus 1 for each of the other 49,152 - n tokens
    law = [{t: math.exp(v) / (sum(math.exp(x) for x in h.values()) + 49152 - len(h)) for t, v in h.items()}
           for h in logits]
    assert [round(law[0][11], 3), round(law[1][21], 3), round(law[2][31], 3)] == [0.554, 0.758, 0.496]
    # products: 11 .554, 11-21 .420, 11-21-31 .208, 12 .204, 12-21 .155, 11-21-32 .127 (then 13 .075 and 11-22 .057)
    drafter = MedusaTreeDrafter(heads_of(tiny, write(tmp_path / "h", constant_heads(64, 49152, logits), 3, 1)), 6)
    draft = drafter.propose(ready(drafter, tiny), 3)
    assert draft.tokens.tolist() == [11, 12, 21, 21, 31, 32] and draft.q is None
    assert draft.parents == (-1, -1, 0, 1, 2, 2)
    shallow = drafter.propose(ready(drafter, tiny), 1)  # depth 1: the first head's candidates only
    assert shallow.tokens.tolist()[:3] == [11, 12, 13] and shallow.parents == (-1,) * 6


def test_rank_tree_by_hand():
    logp = [[math.log(0.6), math.log(0.3), math.log(0.1)], [math.log(0.7), math.log(0.2), math.log(0.1)]]
    # (0) .6, (0, 0) .42, (1) .3, (1, 0) .21, then (0, 1) .12
    assert rank_tree(logp, 4) == ([(0,), (1,), (0, 0), (1, 0)], [-1, -1, 0, 1])
    assert rank_tree(logp, 1) == ([(0,)], [-1])


LAYOUTS = [(medusa_files.SAFETENSORS, ""), (medusa_files.SAFETENSORS, "medusa_head."), (medusa_files.PT, ""),
           (medusa_files.PT, "medusa_head.")]


def test_both_layouts_and_prefixes_load_to_the_same_drafts(tiny, tmp_path):
    tensors = random_heads(3, 64, seed=5) | {"1.1.weight": torch.randn(49152, 64)}  # head 1 has its own LM head
    drafts = []
    for n, (name, prefix) in enumerate(LAYOUTS):
        heads = heads_of(tiny, write(tmp_path / str(n), tensors, 3, 1, name, prefix))
        chain, tree = MedusaDrafter(heads), MedusaTreeDrafter(heads, 10)
        drafts.append((chain.propose(ready(chain, tiny), 3).tokens.tolist(),
                       (d := tree.propose(ready(tree, tiny), 3)).tokens.tolist(), d.parents))
    assert all(d == drafts[0] for d in drafts)
    # the chain computed apart: x + SiLU(W x + b), then the head's LM head (the target's for heads 0 and 2)
    prompt = torch.tensor([encode_chat(tiny, "Tell me about rivers.")])
    with torch.inference_mode():
        h = tiny.model(prompt, output_hidden_states=True).hidden_states[-1][0, -1]
    expected = []
    for i in range(3):
        x = h + F.silu(tensors[f"{i}.0.linear.weight"] @ h + tensors[f"{i}.0.linear.bias"])
        expected.append(int((tensors.get(f"{i}.1.weight", tiny.model.lm_head.weight) @ x).argmax()))
    assert drafts[0][0] == expected


@pytest.mark.parametrize("draft", ["medusa:{h}", "medusa-tree:{h}", "medusa-tree:{h}:nodes=5"])
def test_greedy_medusa_equals_plain_greedy_on_the_tiny_model(tiny, tmp_path, draft):
    spec = parse_draft(draft.format(h=write(tmp_path / "h", random_heads(3, 64, seed=2), 3, 1)))
    prompt = encode_chat(tiny, "Write a short poem about the sea.")
    expected = generate(tiny, NoDraft(), prompt, 0, GREEDY, 32, torch.Generator()).output_tokens
    pair = Pair(tiny, [spec])
    for k in (2, 3, 4):
        run = pair.run(spec, prompt, k, GREEDY, 32, seed=0)
        assert run.output_tokens == expected, k
        assert all(r.accepted + r.rejected + r.thrown == r.k and r.depth <= min(k, 3) for r in run.rounds)
    assert (spec.kind == "medusa") == all(r.draft_parents is None for r in run.rounds)


@pytest.mark.parametrize("draft", ["medusa:{h}", "medusa-tree:{h}"])
def test_greedy_medusa_equals_plain_greedy_on_smollm2(smollm2, tmp_path, draft):
    spec = parse_draft(draft.format(h=write(tmp_path / "h", random_heads(4, 576, seed=3, scale=0.02), 4, 1)))
    prompt = encode_chat(smollm2, "Summarise: the river rose, the town moved uphill, and the river fell again.")
    expected = generate(smollm2, NoDraft(), prompt, 0, GREEDY, 24, torch.Generator()).output_tokens
    run = Pair(smollm2, [spec]).run(spec, prompt, 4, GREEDY, 24, seed=0)
    assert run.output_tokens == expected
    assert sum(r.accepted for r in run.rounds) > 0  # the target's own LM head behind the heads: some drafts hold


def _medusa_counts(target: Loaded, heads, tree: bool, n: int) -> tuple[torch.Tensor, int]:
    """Counts of the two tokens after the prefill's over n seeded generations of 3 tokens at depth 2; how many
    first rounds drafted a branching tree."""
    counts, branching = torch.zeros(VOCAB, VOCAB), 0
    decoding = Decoding("sample", 1.0, 1.0)
    for seed in range(n):
        drafter = MedusaTreeDrafter(heads, nodes=5) if tree else MedusaDrafter(heads)
        run = generate(target, drafter, PROMPT, 2, decoding, 3, torch.Generator().manual_seed(seed))
        counts[run.output_tokens[1], run.output_tokens[2]] += 1
        branching += run.rounds[0].draft_parents is not None
    return counts.view(-1), branching


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
@pytest.mark.parametrize("exact", [True, False], ids=["exact", "no-residual"])
def test_sampled_medusa_matches_the_targets_two_token_law(monkeypatch, tmp_path, exact, tree):
    target, n = _target(), 2500
    path = write(tmp_path / "h", random_heads(2, 64, seed=4, vocab=VOCAB, scale=0.5), 2, 1)
    heads = medusa_files.load(medusa_files.check(str(path), target.model.config), target.model.lm_head.weight,
                              VOCAB, target.device, target.dtype)
    if not exact:  # the planted bug: a rejected draft leaves p as it was
        monkeypatch.setattr(sampling, "residual", _no_residual)
        monkeypatch.setattr(trees, "residual", _no_residual)
    with torch.inference_mode():
        counts, branching = _medusa_counts(target, heads, tree, n)
    pvalue, outcomes = pooled_chisquare(counts, two_token_law(target, PROMPT, VOCAB, Decoding("sample", 1.0, 1.0)), n)
    assert outcomes >= 20 and branching == (n if tree else 0)
    assert pvalue > 1e-3 if exact else pvalue < 1e-6


def _refusal(tiny_dir: Path, head: Path | str) -> str:
    code, _, stderr = invoke(["generate", "--target", str(tiny_dir), "--prompt", "hi", "--max-new-tokens", "2",
                              "--draft", f"medusa:{head}"])
    lines = stderr.strip().splitlines()
    assert code == 2 and len(lines) == 1, stderr
    return lines[0].removeprefix("error: ")


def _corrupt(path: Path, name: str, content: bytes) -> Path:
    write(path, random_heads(3, 64, seed=0), 3, 1)
    (path / medusa_files.SAFETENSORS).unlink()
    (path / name).write_bytes(content)
    return path


def test_every_refusal_is_one_line(tiny_dir, tmp_path):
    good = random_heads(3, 64, seed=0)
    cases = {}

    def case(name: str, tensors: dict = good, config: object = None, **kwargs) -> Path:
        path = write(tmp_path / name, tensors, 3, 1, **kwargs)
        if config is not None:
            (path / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
        return path

    p = case("noconfig")
    (p / "config.json").unlink()
    cases[p] = f"{p}: no config.json"
    p = case("badjson", config="{")
    cases[p] = f"{p}/config.json: not valid JSON"
    no_keys = "config.json: no medusa_num_heads and medusa_num_layers at its top level, so not the Medusa-1 " \
              "layout (other layouts are refused)"
    p = case("vllm", config={"num_heads": 3, "num_hidden_layers": 1})
    cases[p] = f"{p}/{no_keys}"
    p = case("nested", config={"medusa": {"medusa_num_heads": 3, "medusa_num_layers": 1}})
    cases[p] = f"{p}/{no_keys}"
    p = case("zero", config={"medusa_num_heads": 0, "medusa_num_layers": 1})
    cases[p] = f"{p}/config.json: medusa_num_heads must be a whole number >= 1, got 0"
    p = case("string", config={"medusa_num_heads": 3, "medusa_num_layers": "1"})
    cases[p] = f'{p}/config.json: medusa_num_layers must be a whole number >= 0, got "1"'
    p = case("noweights")
    (p / medusa_files.SAFETENSORS).unlink()
    cases[p] = f"{p}: no weights (medusa_lm_head.safetensors, medusa_lm_head.pt)"
    p = _corrupt(tmp_path / "badst", medusa_files.SAFETENSORS, b"not safetensors")
    cases[p] = f"{p}/medusa_lm_head.safetensors: not a readable safetensors file"
    p = _corrupt(tmp_path / "badpt", medusa_files.PT, b"not a pickle")
    cases[p] = f"{p}/medusa_lm_head.pt: not a PyTorch state dict of plain tensors (read with weights_only)"
    p = case("extra", good | {"3.0.linear.weight": torch.zeros(64, 64)})
    cases[p] = f"{p}/medusa_lm_head.safetensors: tensor 3.0.linear.weight is not in the layout of 3 heads of 1 " \
               "residual blocks each; refused, not dropped"
    p = case("width", good | {"0.0.linear.weight": torch.zeros(32, 32)})
    cases[p] = f"{p}/medusa_lm_head.safetensors: 0.0.linear.weight has shape [32, 32], the target (hidden size 64, " \
               "vocabulary 49152) implies [64, 64]"
    p = case("vocab", good | {"2.1.weight": torch.zeros(32000, 64)})
    cases[p] = f"{p}/medusa_lm_head.safetensors: 2.1.weight has shape [32000, 64], the target (hidden size 64, " \
               "vocabulary 49152) implies [49152, 64]"
    p = case("missing", {k: v for k, v in good.items() if k != "1.0.linear.bias"})
    cases[p] = f"{p}/medusa_lm_head.safetensors: no tensor 1.0.linear.bias (with or without the medusa_head. prefix)"
    p = case("twice", good | {"medusa_head.0.0.linear.weight": torch.zeros(64, 64)})
    cases[p] = f"{p}/medusa_lm_head.safetensors: holds both 0.0.linear.weight and medusa_head.0.0.linear.weight"
    cases["/no/such/heads"] = "no such draft head directory: /no/such/heads"
    assert {str(p): _refusal(tiny_dir, p) for p in cases} == {str(p): m for p, m in cases.items()}


def test_training_rows_pair_each_state_with_the_tokens_two_and_more_places_on():
    # tokens 10..15, the answer from index 3: states 2, 3, 4 can start a round (state 2 made token 13)
    sample = Sample("p", "code", torch.arange(10, 16), torch.arange(5.0)[:, None].expand(5, 4), answer_start=3)
    x, y, categories = medusa_fit.rows([sample], heads=2)
    assert x[:, 0].tolist() == [2.0, 3.0, 4.0] and categories == ["code"] * 3
    assert y.tolist() == [[14, 15], [15, IGNORE], [IGNORE, IGNORE]]  # head i: token t + 2 + i


def test_trained_medusa_heads_load_back_and_draft(tmp_path, tiny_dir, tiny, monkeypatch):
    monkeypatch.setenv("SPECDASH_CACHE", str(tmp_path / "cache"))
    config = tiny_config(tmp_path, tiny_dir, kind="medusa", unroll=3, epochs=2, lr=1e-2)
    trained = train_draft(config, Console(quiet=True))
    assert [e.number for e in trained.epochs] == [0, 1, 2]
    assert trained.epochs[-1].heldout_loss < trained.epochs[0].heldout_loss
    con = duckdb.connect(str(config.db), read_only=True)
    row = con.execute("SELECT status, draft, unroll, draft_vocab, layers FROM trainings").fetchall()
    assert row == [("ok", f"medusa:{config.out}", 3, 49152, [-1])]
    positions = con.execute("SELECT epoch, position, judged, accepted FROM training_positions WHERE category = 'all' "
                            "ORDER BY ALL").fetchall()
    con.close()
    assert positions == [(e.number, j + 1, *e.positions[j]) for e in trained.epochs for j in range(3)]
    assert json.loads((config.out / "config.json").read_text())["medusa_num_heads"] == 3
    assert set(medusa_files.check(str(config.out), tiny.model.config).names) == {
        f"{i}.0.linear.{w}" for i in range(3) for w in ("weight", "bias")}  # the target's LM head is not saved
    prompt = encode_chat(tiny, "Tell me about poem number 9, please.")
    expected = generate(tiny, NoDraft(), prompt, 0, GREEDY, 12, torch.Generator()).output_tokens
    for draft in (f"medusa:{config.out}", f"medusa-tree:{config.out}"):
        spec = parse_draft(draft)
        run = Pair(tiny, [spec]).run(spec, prompt, 3, GREEDY, 12, seed=0)
        assert run.output_tokens == expected and all(r.k > 0 for r in run.rounds[:-1])


def test_check_head_tells_a_medusa_layout_and_refuses_as_medusa_does(tiny_dir, tmp_path):
    vocab = json.loads((tiny_dir / "config.json").read_text())["vocab_size"]
    tensors = random_heads(3, 64, seed=0) | {"1.1.weight": torch.zeros(vocab, 64)}  # head 1 has its own LM head
    path = write(tmp_path / "heads", tensors, 3, 1, name=medusa_files.PT, prefix="medusa_head.")
    code, stdout, _ = invoke(["check-head", str(path), "--target", str(tiny_dir)])
    assert code == 0
    assert stdout.splitlines() == [
        f"head: {path}",
        "weights: medusa_lm_head.pt, 7 tensors, every one read",
        "layout: Medusa-1, 3 heads of 1 residual blocks each, over the target's last hidden state after its final "
        "norm (width 64); head i's likeliest token is draft i + 1",
        "LM heads: their own for heads [1], the target's for the others",
        f"refused: nothing; loads as medusa:{path} and medusa-tree:{path}"]
    wide = write(tmp_path / "wide", random_heads(3, 32, seed=0), 3, 1)
    code, stdout, stderr = invoke(["check-head", str(wide), "--target", str(tiny_dir)])
    assert (code, stdout) == (2, "")
    assert stderr.strip() == f"error: {_refusal(tiny_dir, wide)}"  # the line `medusa:` refuses it with
