"""EAGLE-style draft heads: the published checkpoint layout, the `eagle:` drafter (lossless, exact when
sampling, its cache in step with the committed text), training-time test = drafting, and bad heads refused."""

from __future__ import annotations

import json
import math
from pathlib import Path

import huggingface_hub.constants
import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from runner.cli import app
from runner.engine.drafters.eagle import EagleDrafter
from runner.engine.drafters.registry import parse_draft
from runner.engine.pair import Pair
from runner.engine.round.decode import generate
from runner.engine.round.decoding_rule import Decoding
from runner.engine.round.draft import NoDraft
from runner.engine.weights import head_files, models
from runner.engine.weights.head_config import HeadConfig
from runner.engine.weights.heads import EagleHead
from runner.train.data import Sample
from runner.train.unroll import batches, unroll
from tests.helpers.laws import pooled_chisquare, two_token_law
from tests.helpers.tiny import tiny_llama

GREEDY = Decoding("greedy", 0.0, 1.0)
SHIPPED = Path(__file__).resolve().parents[2] / "heads" / "smollm2-135m"


def published_config(hidden: int, vocab: int, draft_vocab: int) -> dict:
    """config.json as EAGLE-3 heads for Llama targets are published: no target_hidden_size, no layer ids."""
    return {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
            "hidden_size": hidden, "intermediate_size": 2 * hidden, "num_attention_heads": 4,
            "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "hidden_act": "silu", "max_position_embeddings": 512,
            "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "float16", "vocab_size": vocab,
            "draft_vocab_size": draft_vocab, "bos_token_id": 1, "eos_token_id": 2}


def published_tensors(hidden: int, vocab: int, draft_ids: torch.Tensor, seed: int) -> dict[str, torch.Tensor]:
    """Random fp16 weights under the published names; d2t holds offsets (draft id + d2t = target id)."""
    g = torch.Generator().manual_seed(seed)
    q, kv, inner = 4 * (hidden // 4), 2 * (hidden // 4), 2 * hidden

    def w(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) / math.sqrt(shape[-1])).half()

    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[draft_ids] = True
    return {
        "fc.weight": w(hidden, 3 * hidden), "midlayer.self_attn.q_proj.weight": w(q, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": w(kv, 2 * hidden), "midlayer.self_attn.v_proj.weight": w(kv, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": w(hidden, q), "midlayer.mlp.gate_proj.weight": w(inner, hidden),
        "midlayer.mlp.up_proj.weight": w(inner, hidden), "midlayer.mlp.down_proj.weight": w(hidden, inner),
        "midlayer.input_layernorm.weight": torch.ones(hidden).half(),
        "midlayer.hidden_norm.weight": torch.ones(hidden).half(),
        "midlayer.post_attention_layernorm.weight": torch.ones(hidden).half(),
        "norm.weight": torch.ones(hidden).half(), "lm_head.weight": w(draft_ids.numel(), hidden) * 8,
        "d2t": draft_ids - torch.arange(draft_ids.numel()), "t2d": t2d,
    }


def write_head(path: Path, config: dict, tensors: dict[str, torch.Tensor]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    save_file(tensors, path / "model.safetensors")
    return path


DRAFT_IDS = torch.arange(0, 49152, 40)  # 1229 of SmolLM2's tokens


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A head for the tiny test model (hidden 64, 4 layers, SmolLM2's vocabulary) in the published layout."""
    path = tmp_path_factory.mktemp("published") / "head"
    return write_head(path, published_config(64, 49152, DRAFT_IDS.numel()), published_tensors(64, 49152, DRAFT_IDS, 0))


def test_a_head_in_the_published_layout_loads_with_its_weights_and_layers(tiny, published):
    checked = head_files.check(str(published), tiny.model.config)
    assert checked.layers == (2, 2, 1)  # EAGLE-3's default for 4 layers: inputs of layers 2, 4 // 2 and 4 - 3
    head = head_files.load(checked, tiny.model.get_input_embeddings(), tiny.device, torch.float32)
    expected = published_tensors(64, 49152, DRAFT_IDS, 0)
    for name, tensor in head.weights().items():
        torch.testing.assert_close(tensor, expected[name].to(tensor.dtype), rtol=0, atol=0)
    assert head.draft_ids.tolist() == DRAFT_IDS.tolist()
    assert head.embed_tokens is tiny.model.get_input_embeddings()  # read from the target, not copied


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_greedy_eagle_equals_plain_greedy_on_the_tiny_model(tiny, published, k):
    spec = parse_draft(f"eagle:{published}")
    pair = Pair(tiny, [spec])
    prompt = list(range(100, 140))
    expected = generate(tiny, NoDraft(), prompt, 0, GREEDY, 40, torch.Generator()).output_tokens
    assert pair.run(spec, prompt, k, GREEDY, 40, seed=0).output_tokens == expected


def smollm2_head(smollm2: models.Loaded, tmp: Path) -> Path:
    """A random head for SmolLM2 written by specdash's own saver: drafts that are mostly wrong, so rounds roll back."""
    from runner.train.fit import default_layers, initial_head

    head = initial_head(smollm2, default_layers(30), torch.arange(0, 49152, 16), torch.tensor([3.0, 6.5, 22.6]), 0)
    with torch.no_grad():  # trained heads have non-zero branches: give the layer a say
        for weight in (head.midlayer.self_attn.o_proj.weight, head.midlayer.mlp.down_proj.weight):
            weight.normal_(0, 0.05)
    head_files.save(head, tmp / "smollm2-head")
    return tmp / "smollm2-head"


def test_greedy_eagle_equals_plain_greedy_on_smollm2(smollm2, tmp_path):
    spec = parse_draft(f"eagle:{smollm2_head(smollm2, tmp_path)}")
    pair = Pair(smollm2, [spec])
    prompt = models.encode_chat(smollm2, "Write a haiku about a quiet harbour.")
    expected = generate(smollm2, NoDraft(), prompt, 0, GREEDY, 24, torch.Generator()).output_tokens
    for k in (1, 3, 6):
        assert pair.run(spec, prompt, k, GREEDY, 24, seed=0).output_tokens == expected, k


def test_the_shipped_head_drafts_losslessly_and_is_often_right_on_a_prompt_it_never_saw(smollm2):
    spec = parse_draft(f"eagle:{SHIPPED}")
    pair = Pair(smollm2, [spec])
    prompt = models.encode_chat(smollm2, "Write a Python function that returns the largest of three numbers.")
    expected = generate(smollm2, NoDraft(), prompt, 0, GREEDY, 32, torch.Generator()).output_tokens
    run = pair.run(spec, prompt, 2, GREEDY, 32, seed=0)
    accepted, rejected = sum(r.accepted for r in run.rounds), sum(r.rejected for r in run.rounds)
    # lossless, and trained: a random head of the same layout is right about once in 49,152 / 16 draft tokens
    assert run.output_tokens == expected and accepted / (accepted + rejected) > 0.3


class Recording(EagleDrafter):
    """Logs each round's committed length and its q (sampling), to check them against one full pass."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        self.log: list[tuple[int, torch.Tensor]] = []

    def propose(self, tokens: torch.Tensor, k: int):
        draft = super().propose(tokens, k)
        if k:
            self.log.append((tokens.numel(), draft.q))
        return draft


def one_pass(head: EagleHead, target: models.Loaded, text: list[int]) -> torch.Tensor:
    """The head's step-0 scores (N-1, Vd) over the whole text from one target pass and one head pass: what its
    cache must match after any sequence of rounds and rollbacks."""
    with torch.inference_mode():
        hidden = target.model(input_ids=torch.tensor([text]), output_hidden_states=True).hidden_states
        features = torch.cat([hidden[i][0] for i in head.target_layers], dim=-1)[:-1]
        sample = Sample("p", "c", torch.tensor(text), features, 1)
        (out,) = unroll(head, batches([sample], 10**6, None, torch.device("cpu"))[0], 1)
        return head.logits(out[0])


def test_after_every_round_the_heads_cache_holds_exactly_the_committed_text(tiny, published):
    """Sampling at temperature 1: each round's first q is the head's softmax at the last committed position,
    which one pass over the finished text reproduces whatever was drafted, rejected and rolled back before."""
    checked = head_files.check(str(published), tiny.model.config)
    head = head_files.load(checked, tiny.model.get_input_embeddings(), tiny.device, torch.float32)
    decoding = Decoding("sample", 1.0, 1.0)
    gen = torch.Generator().manual_seed(3)
    drafter = Recording(head, decoding, gen)
    out = generate(tiny, drafter, list(range(100, 120)), 3, decoding, 30, gen)
    assert any(r.rejected for r in out.rounds) and any(r.bonus for r in out.rounds)
    scores = one_pass(head, tiny, list(out.prompt_tokens + out.output_tokens))
    for committed, q in drafter.log:
        expected = torch.zeros(49152)
        expected[head.draft_ids] = torch.softmax(scores[committed - 2], -1)
        torch.testing.assert_close(q[0], expected, atol=2e-5, rtol=1e-3)


def test_the_training_time_test_computes_what_the_drafter_drafts(tiny, published):
    """Draft k = 3 after a prompt, then unroll the head as training does over prompt + those drafts: every
    step's distribution at the prompt's end equals the drafter's q for that draft."""
    checked = head_files.check(str(published), tiny.model.config)
    head = head_files.load(checked, tiny.model.get_input_embeddings(), tiny.device, torch.float32)
    prompt = list(range(300, 330))
    with torch.inference_mode():
        hidden = tiny.model(input_ids=torch.tensor([prompt]), output_hidden_states=True).hidden_states
    features = torch.cat([hidden[i][0] for i in head.target_layers], dim=-1)  # (P, 3H): every prompt position
    drafter = EagleDrafter(head, Decoding("sample", 1.0, 1.0), torch.Generator().manual_seed(0))
    tokens = torch.tensor(prompt + [7])  # + the prefill's token
    drafter.prefill(tokens, features, None)
    with torch.inference_mode():
        draft = drafter.propose(tokens, 3)
        text = torch.cat([tokens, draft.tokens])
        padded = torch.cat([features, torch.zeros(text.numel() - 1 - features.shape[0], features.shape[1])])
        batch = batches([Sample("p", "c", text, padded, 0)], 10**6, None, torch.device("cpu"))[0]
        for step, out in enumerate(unroll(head, batch, 3)):
            expected = torch.zeros(49152)
            expected[head.draft_ids] = torch.softmax(head.logits(out[0, len(prompt) - 1]), -1)
            torch.testing.assert_close(draft.q[step], expected, atol=2e-5, rtol=1e-3)


def tiny_pair(vocab: int, draft_ids: list[int]) -> tuple[models.Loaded, EagleHead]:
    """A vocabulary-8 target with spread distributions and a random head whose draft vocabulary is a part of it."""
    model = tiny_llama(vocab, seed=5, layers=4)
    model.generation_config.eos_token_id = 99  # outside the vocabulary: never stops early
    model.lm_head.weight = torch.nn.Parameter(torch.randn(model.lm_head.weight.shape,
                                                          generator=torch.Generator().manual_seed(6)) * 0.05)
    target = models.Loaded("tiny-8", model, None, torch.device("cpu"), torch.float32)
    config = HeadConfig(hidden_size=64, target_hidden_size=64, intermediate_size=128, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5, vocab_size=vocab,
                        draft_vocab_size=len(draft_ids), max_position_embeddings=512)
    torch.manual_seed(7)
    head = EagleHead(config, model.get_input_embeddings(), config.hidden_layers(4)).eval().requires_grad_(False)
    head.set_vocabulary(torch.tensor(draft_ids))
    return target, head


def test_eagle_sampling_reproduces_the_targets_joint_distribution():
    """q is zero outside the draft vocabulary ({0, 2, 3, 5, 7} of 8): the two tokens after the prefill's (one
    round of k = 2) still follow the target's joint law, computed exactly by full forward passes."""
    vocab, decoding, prompt, n = 8, Decoding("sample", 0.8, 0.95), [1, 2, 3], 2000
    target, head = tiny_pair(vocab, [0, 2, 3, 5, 7])
    counts = torch.zeros(vocab, vocab)
    for seed in range(n):
        gen = torch.Generator().manual_seed(seed)
        out = generate(target, EagleDrafter(head, decoding, gen), prompt, 2, decoding, 4, gen).output_tokens
        counts[out[1], out[2]] += 1
    pvalue, outcomes = pooled_chisquare(counts.view(-1), two_token_law(target, prompt, vocab, decoding), n)
    assert pvalue > 1e-3
    assert outcomes >= 20  # the law is spread over many outcomes, so the test means something
    # and the test has power: tokens outside the draft vocabulary do occur, through the residual and the bonus
    assert counts[[1, 4, 6]].sum() > 0 and counts[:, [1, 4, 6]].sum() > 0


def bad_heads(root: Path) -> dict[str, tuple[str, str]]:
    """name -> (the --draft value, the message's telling part); each head is wrong in one way."""
    good_config, good = published_config(64, 49152, DRAFT_IDS.numel()), published_tensors(64, 49152, DRAFT_IDS, 0)
    cases: dict[str, tuple[str, str]] = {
        "missing directory": ("eagle:/no/such/head", "no such draft head directory: /no/such/head"),
        "unknown repo id": ("eagle:nobody/no-such-head", "not in the local Hugging Face cache"),
    }

    def case(name: str, message: str, config: dict | str | None = good_config,
             tensors: dict | bytes | None = good) -> None:
        path = root / name.replace(" ", "-")
        path.mkdir(parents=True)
        if config is not None:
            (path / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
        if isinstance(tensors, bytes):
            (path / "model.safetensors").write_bytes(tensors)
        elif tensors is not None:
            save_file(tensors, path / "model.safetensors")
        cases[name] = (f"eagle:{path}", message)

    case("no config", "no config.json", config=None)
    case("corrupt config", "config.json: not valid JSON", config="{hidden_size: 64")
    case("config without a size", "config.json: missing 'hidden_size'",
         config={k: v for k, v in good_config.items() if k != "hidden_size"})
    case("no weights", "no weights (model.safetensors, model.safetensors.index.json, pytorch_model.bin", tensors=None)
    case("weights that are not safetensors", "not a readable safetensors file", tensors=b"\x00" * 64)
    save_file(good, root / "whole.safetensors")
    case("truncated weights", "not a readable safetensors file",
         tensors=(root / "whole.safetensors").read_bytes()[:-1000])
    case("a missing tensor", "no tensor midlayer.mlp.up_proj.weight",
         tensors={k: v for k, v in good.items() if k != "midlayer.mlp.up_proj.weight"})
    case("a tensor of the wrong shape", "lm_head.weight has shape [1229, 32]",
         tensors=good | {"lm_head.weight": torch.zeros(DRAFT_IDS.numel(), 32).half()})
    case("a head for a wider target", "reads hidden states of width 96, the target's are 64 wide",
         config=published_config(96, 49152, DRAFT_IDS.numel()), tensors=published_tensors(96, 49152, DRAFT_IDS, 0))
    small = torch.arange(0, 1000, 10)
    case("a head for another vocabulary", "vocabulary has 1000 tokens, the target's 49152",
         config=published_config(64, 1000, small.numel()), tensors=published_tensors(64, 1000, small, 0))
    case("d2t outside the vocabulary", "d2t does not map the draft vocabulary onto distinct target tokens",
         tensors=good | {"d2t": good["d2t"] + 49152})
    return cases


def test_bad_heads_get_one_line_and_exit_2_before_any_model_loads(tmp_path, tiny_dir, monkeypatch):
    def no_loading(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model was loaded before the head was checked")

    monkeypatch.setattr(models, "load", no_loading)
    db = tmp_path / "runs.duckdb"
    for name, (draft, message) in bad_heads(tmp_path / "heads").items():
        for command in (["sweep", "--k", "2", "--prompts-per-category", "1", "--db", str(db)],
                        ["generate", "--prompt", "hi"]):
            result = CliRunner().invoke(app, [*command, "--target", str(tiny_dir), "--draft", draft])
            lines = result.stderr.strip().splitlines()
            assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (name, result.stderr)
            assert message in lines[0], (name, lines[0])
    assert not db.exists()


def test_a_repo_id_is_read_from_the_local_hugging_face_cache(tiny, published, tmp_path, monkeypatch):
    """`eagle:<org>/<name>` finds a head downloaded before, in the hub's cache layout, without the network."""
    snapshot = tmp_path / "hub" / "models--someone--eagle3-tiny" / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        (snapshot / name).write_bytes((published / name).read_bytes())
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("0123abcd")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    checked = head_files.check("someone/eagle3-tiny", tiny.model.config)
    assert checked.path == snapshot and checked.layers == (2, 2, 1)
    spec = parse_draft("eagle:someone/eagle3-tiny")
    prompt = list(range(100, 130))
    expected = generate(tiny, NoDraft(), prompt, 0, GREEDY, 20, torch.Generator()).output_tokens
    assert Pair(tiny, [spec]).run(spec, prompt, 3, GREEDY, 20, seed=0).output_tokens == expected
