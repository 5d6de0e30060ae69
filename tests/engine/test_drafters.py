"""What each drafter proposes, worked out by hand or by an independent forward pass.

Lossless checks cannot see a wrong proposal (the target corrects it; only α moves), so the proposals
themselves are checked here.
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import DynamicCache, GPT2Config, GPT2LMHeadModel, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from runner.engine.drafters.model import ModelDrafter, layer_skip
from runner.engine.drafters.ngram import NgramDrafter
from runner.engine.round.decoding_rule import Decoding
from runner.engine.round.draft import crop_to
from tests.helpers.tiny import greedy_without_cache, tiny_llama

GREEDY = Decoding("greedy", 0.0, 1.0)


def lookup(n: int, text: list[int], k: int) -> list[int]:
    drafter = NgramDrafter(n)
    drafter.prefill(torch.tensor(text), None, None)
    draft = drafter.propose(torch.tensor(text), k)
    assert draft.q is None and draft.tokens.dtype == torch.long
    return draft.tokens.tolist()


@pytest.mark.parametrize(("n", "text", "k", "expected"), [
    # the last 3 tokens (1, 2, 3) appeared at the start, followed by 4, 1, 2, 3
    (3, [1, 2, 3, 4, 1, 2, 3], 2, [4, 1]),
    (3, [1, 2, 3, 4, 1, 2, 3], 8, [4, 1, 2, 3]),  # cut where the text ends
    (3, [1, 2, 3, 4, 1, 2, 3], 1, [4]),
    # (5, 6) appeared twice: the latest occurrence wins (followed by 8, not 7)
    (2, [5, 6, 7, 5, 6, 8, 5, 6], 3, [8, 5, 6]),
    # (3, 4, 2) and (4, 2) never appeared; (2,) did, followed by 3, 4
    (3, [9, 1, 2, 3, 4, 2], 2, [3, 4]),
    # the longest match first: (1, 2, 3) is followed by 7, though the latest 3 is followed by 8
    (3, [1, 2, 3, 7, 3, 8, 1, 2, 3], 2, [7, 3]),
    # (9, 2, 3) never appeared; (2, 3) did, followed by 5, before (3,) whose latest continuation is 6
    (3, [4, 2, 3, 5, 3, 6, 9, 2, 3], 2, [5, 3]),
    # the 1-gram (1,) at the start is followed by 2, 1: only two tokens to propose for k = 4
    (1, [1, 2, 1], 4, [2, 1]),
    # no earlier occurrence of the last token: nothing to propose
    (3, [1, 2, 3, 4], 4, []),
    (3, [1, 2, 1, 2], 0, []),  # k = 0: nothing asked
    (3, [7], 2, []),
])
def test_prompt_lookup_proposes_what_followed_the_latest_longest_match(n, text, k, expected):
    assert lookup(n, text, k) == expected


def test_prompt_lookup_reads_new_text_as_it_is_committed():
    drafter = NgramDrafter(2)
    drafter.prefill(torch.tensor([5, 6, 7, 1]), None, None)
    assert drafter.propose(torch.tensor([5, 6, 7, 1]), 3).tokens.tolist() == []
    # two more committed tokens: the text ends with (5, 6) again, followed before by 7, 1
    assert drafter.propose(torch.tensor([5, 6, 7, 1, 5, 6]), 3).tokens.tolist() == [7, 1, 5]
    assert drafter.propose(torch.tensor([5, 6, 7, 1, 5, 6, 9, 7]), 2).tokens.tolist() == [1, 5]
    assert drafter.calls == 3


@pytest.fixture(scope="module")
def target() -> LlamaForCausalLM:
    return tiny_llama(64, seed=5, layers=4)


TEXT = torch.tensor([3, 17, 42, 8, 8, 51, 23, 9, 30, 12])
VOCAB = 64  # the tiny models' vocabulary, target's and drafts' alike


def first_layers(model: LlamaForCausalLM, layers: int) -> LlamaForCausalLM:
    """Independently: a fresh model of `layers` layers, loaded with the target's first layers, norm and head."""
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = layers
    short = LlamaForCausalLM(config).eval()
    result = short.load_state_dict(model.state_dict(), strict=False)
    assert result.missing_keys == []  # every weight it has comes from the target
    assert sorted({k.split(".")[2] for k in result.unexpected_keys}) == [str(i) for i in range(layers, 4)]
    return short


@pytest.mark.parametrize("layers", [1, 2, 3])
def test_layer_skip_is_the_first_layers_then_the_final_norm_and_head(target, layers):
    draft = layer_skip(target, layers)
    with torch.inference_mode():
        expected = first_layers(target, layers)(input_ids=TEXT[None]).logits
        # the same through the target's own hidden state after layer L
        hidden = target(input_ids=TEXT[None], output_hidden_states=True).hidden_states[layers]
        torch.testing.assert_close(target.lm_head(target.model.norm(hidden)), expected)
        torch.testing.assert_close(draft(input_ids=TEXT[None]).logits, expected)


def test_layer_skip_leaves_the_target_as_it_was_and_shares_its_weights(target):
    with torch.inference_mode():
        before = target(input_ids=TEXT[None]).logits.clone()
        draft = layer_skip(target, 2)
        drafter = ModelDrafter(draft, GREEDY, None, VOCAB)
        drafter.prefill(TEXT, None, None)
        drafter.propose(TEXT, 4)
        assert torch.equal(target(input_ids=TEXT[None]).logits, before)
    assert target.config.num_hidden_layers == 4 and len(target.model.layers) == 4
    assert draft.config.num_hidden_layers == 2 and len(draft.model.layers) == 2
    # its own generation settings (assisted generation changes the assistant's), equal to the target's
    assert draft.generation_config is not target.generation_config
    assert draft.generation_config.to_dict() == target.generation_config.to_dict()
    assert draft.lm_head.weight.data_ptr() == target.lm_head.weight.data_ptr()
    assert draft.model.layers[1].mlp.up_proj.weight.data_ptr() == target.model.layers[1].mlp.up_proj.weight.data_ptr()


@pytest.mark.parametrize("layers", [0, 4, 5])
def test_layer_skip_needs_fewer_layers_than_the_target(target, layers):
    with pytest.raises(ValueError, match=rf"^layerskip:L needs 1 <= L < 4 \(the target's layer count\), got {layers}$"):
        layer_skip(target, layers)


def test_layer_skip_needs_a_decoder_with_layers():
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=2))  # its blocks are `.h`
    with pytest.raises(ValueError, match="^layerskip needs a decoder with .layers; GPT2LMHeadModel has none$"):
        layer_skip(gpt2, 1)


def test_layer_skip_on_smollm2_matches_the_targets_hidden_state_after_layer_l(smollm2):
    text = torch.tensor(smollm2.tokenizer("def average(values):\n    return sum(values) / len(values)")["input_ids"])
    model = smollm2.model
    with torch.inference_mode():
        hidden = model(input_ids=text[None], output_hidden_states=True).hidden_states[12]
        expected = model.lm_head(model.model.norm(hidden))
        torch.testing.assert_close(layer_skip(model, 12)(input_ids=text[None]).logits, expected, atol=1e-4, rtol=1e-4)


def test_a_model_drafter_proposes_its_own_greedy_text_and_keeps_its_cache_at_the_kept_text(target):
    draft = layer_skip(target, 3)
    drafter = ModelDrafter(draft, GREEDY, None, VOCAB)
    text = TEXT.tolist()
    with torch.inference_mode():
        drafter.prefill(TEXT, None, None)
        assert drafter.cache.get_seq_length() == len(text) - 1  # the newest token is fed with the first proposal
        proposed = drafter.propose(TEXT, 4)
        assert proposed.tokens.tolist() == greedy_without_cache(draft, text, 4) and proposed.q is None
        assert drafter.calls == 4 and drafter.cache.get_seq_length() == len(text) + 3
        # the target kept 2 drafts and added its own token (60): the cache forgets the third and fourth draft
        drafter.accepted(2, None, None)
        assert drafter.cache.get_seq_length() == len(text) + 2
        text += proposed.tokens.tolist()[:2] + [60]
        again = drafter.propose(torch.tensor(text), 3)
        assert again.tokens.tolist() == greedy_without_cache(draft, text, 3)


def test_a_sampling_model_drafter_returns_the_probabilities_it_drew_from(target):
    decoding = Decoding("sample", 0.8, 0.9)
    draft = layer_skip(target, 3)
    drafter = ModelDrafter(draft, decoding, torch.Generator().manual_seed(3), VOCAB)
    with torch.inference_mode():
        drafter.prefill(TEXT, None, None)
        proposed = drafter.propose(TEXT, 3)
        assert proposed.q.shape == (3, 64)
        for i in range(3):
            logits = draft(input_ids=torch.cat([TEXT, proposed.tokens[:i]])[None]).logits[0, -1].float() / 0.8
            probs = torch.softmax(logits, -1)
            order = probs.argsort(descending=True)
            kept = order[: int((probs[order].cumsum(0) < 0.9).sum()) + 1]  # the smallest set reaching 0.9
            expected = torch.zeros_like(probs)
            expected[kept] = probs[kept] / probs[kept].sum()
            torch.testing.assert_close(proposed.q[i], expected, atol=1e-5, rtol=1e-5)
            assert proposed.q[i, proposed.tokens[i]] > 0  # each draft was drawn from its row


def test_a_model_drafter_fed_a_one_token_prompt_caches_that_token():
    draft = tiny_llama(64, seed=6)
    drafter = ModelDrafter(draft, GREEDY, None, VOCAB)
    with torch.inference_mode():
        drafter.prefill(torch.tensor([9, 4]), None, None)  # a one-token prompt and the prefill's token
        assert drafter.cache.get_seq_length() == 1
        assert drafter.propose(torch.tensor([9, 4]), 2).tokens.tolist() == greedy_without_cache(draft, [9, 4], 2)


def test_layer_skip_cuts_the_layer_types_of_a_model_that_has_them():
    """Qwen2 names each layer's attention (full or sliding window); the draft keeps the first L names."""
    config = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True, sliding_window=4,
                         max_window_layers=1)
    torch.manual_seed(8)
    target = Qwen2ForCausalLM(config).eval()
    assert target.config.layer_types == ["full_attention"] + ["sliding_attention"] * 3
    draft = layer_skip(target, 2)
    assert draft.config.layer_types == ["full_attention", "sliding_attention"]
    assert target.config.layer_types == ["full_attention"] + ["sliding_attention"] * 3
    with torch.inference_mode():
        hidden = target(input_ids=TEXT[None], output_hidden_states=True).hidden_states[2]
        torch.testing.assert_close(draft(input_ids=TEXT[None]).logits, target.lm_head(target.model.norm(hidden)))


def test_crop_to_keeps_the_first_positions(target):
    cache = DynamicCache(config=target.config)
    with torch.inference_mode():
        target(input_ids=TEXT[None], cache=cache, use_cache=True)
        keys = cache.layers[0].keys.clone()
        crop_to(cache, 6)
        assert cache.get_seq_length() == 6
        assert torch.equal(cache.layers[0].keys, keys[:, :, :6])
