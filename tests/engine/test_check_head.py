"""EAGLE-3 heads in every layout the engines load: each read exactly (the same draft as the base layout, or as a
forward pass written out here from the published equations) or refused in one line by `runner check-head`."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from runner.cli import app
from runner.engine.drafters.eagle import EagleDrafter
from runner.engine.drafters.registry import parse_draft
from runner.engine.pair import Pair
from runner.engine.round import hidden_states
from runner.engine.round.decode import generate
from runner.engine.round.decoding_rule import Decoding
from runner.engine.round.draft import NoDraft
from runner.engine.weights import head_files, models
from runner.engine.weights.head_config import HeadConfig
from tests.engine.test_heads import DRAFT_IDS, GREEDY, published_config, published_tensors, write_head
from tests.helpers.eagle_reference import two_drafts

SAMPLE = Decoding("sample", 1.0, 1.0)  # q is then the head's plain softmax, scattered over the target's vocabulary
PROMPT = list(range(300, 330)) + [7]  # the prompt and the prefill's token
VOCAB = 49152


def drafted(tiny: models.Loaded, path: Path, k: int = 3, dtype: torch.dtype = torch.float32) -> tuple:
    """The drafts and their q (k, V) after PROMPT, from the head loaded as `eagle:` loads it."""
    checked = head_files.check(str(path), tiny.model.config)
    head = head_files.load(checked, tiny.model.get_input_embeddings(), tiny.device, dtype)
    tokens = torch.tensor(PROMPT)
    with torch.inference_mode():
        features = target_features(tiny, head.target_layers, tokens[:-1])
        drafter = EagleDrafter(head, SAMPLE, torch.Generator().manual_seed(0))
        drafter.prefill(tokens, features[0], None)
        draft = drafter.propose(tokens, k)
    return checked, draft.tokens, draft.q


def target_features(tiny: models.Loaded, layers: tuple[int, ...], tokens: torch.Tensor) -> torch.Tensor:
    """(1, T, 3·H) the target's hidden states at `layers`, as a verify pass reads them."""
    with hidden_states.reading(tiny.model, layers) as features_of:
        return features_of(tiny.model(input_ids=tokens[None], output_hidden_states=True))


def with_ids(config: dict, top: list[int] | None = None, nested: list[int] | None = None) -> dict:
    return config | ({} if top is None else {"eagle_aux_hidden_state_layer_ids": top}) | (
        {} if nested is None else {"eagle_config": {"eagle_aux_hidden_state_layer_ids": nested}})


def write_shards(path: Path, config: dict, tensors: dict[str, torch.Tensor], kind: str) -> Path:
    """The tensors in two shards and the index that lists them, as transformers writes them."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    names = sorted(tensors)
    shards = {f"model-0000{i + 1}-of-00002.{kind}": names[i::2] for i in range(2)}
    for shard, held in shards.items():
        part = {n: tensors[n] for n in held}
        save_file(part, path / shard) if kind == "safetensors" else torch.save(part, path / shard)
    index = "model.safetensors.index.json" if kind == "safetensors" else "pytorch_model.bin.index.json"
    weight_map = {n: shard for shard, held in shards.items() for n in held}
    (path / index).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return path


def test_every_weight_layout_drafts_what_the_base_layout_drafts(tiny, tmp_path):
    config, tensors = published_config(64, VOCAB, DRAFT_IDS.numel()), published_tensors(64, VOCAB, DRAFT_IDS, 0)
    _, tokens, q = drafted(tiny, write_head(tmp_path / "base", config, tensors))
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "config.json").write_text(json.dumps(config))
    torch.save(tensors, tmp_path / "bin" / "pytorch_model.bin")
    (tmp_path / "old-bin").mkdir()
    (tmp_path / "old-bin" / "config.json").write_text(json.dumps(config))
    torch.save(tensors, tmp_path / "old-bin" / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    variants = {
        "pytorch_model.bin": tmp_path / "bin",
        "pytorch_model.bin (the format before torch 1.6)": tmp_path / "old-bin",
        "model.safetensors.index.json (2 shards)": write_shards(tmp_path / "st", config, tensors, "safetensors"),
        "pytorch_model.bin.index.json (2 shards)": write_shards(tmp_path / "pt", config, tensors, "bin"),
        "model.safetensors": write_head(tmp_path / "no-t2d", config, {n: t for n, t in tensors.items() if n != "t2d"}),
    }
    for described, path in variants.items():
        checked, other_tokens, other_q = drafted(tiny, path)
        assert checked.weights.described == described.split(" (the")[0]
        assert torch.equal(other_tokens, tokens) and torch.equal(other_q, q), described
    assert drafted(tiny, variants["model.safetensors"])[0].t2d == "derived from d2t"
    spec = parse_draft(f"eagle:{tmp_path / 'pt'}")  # and a sharded .bin head drafts losslessly in a generation
    expected = generate(tiny, NoDraft(), PROMPT, 0, GREEDY, 24, torch.Generator()).output_tokens
    assert Pair(tiny, [spec]).run(spec, PROMPT, 3, GREEDY, 24, seed=0).output_tokens == expected


def test_layer_ids_in_either_convention_and_either_place_read_the_same_layers(tiny, tmp_path):
    """Hidden states 2, 3 and 4 of the 4-layer target, named five ways; the first id tells the convention apart."""
    config, tensors = published_config(64, VOCAB, DRAFT_IDS.numel()), published_tensors(64, VOCAB, DRAFT_IDS, 1)
    ways = {
        "inputs of layers, under eagle_config": with_ids(config, nested=[2, 3, 4]),
        "outputs of layers (first id 1)": with_ids(config, nested=[1, 2, 3]),
        "the top-level key, read before eagle_config's": with_ids(config, top=[2, 3, 4], nested=[0, 1, 1]),
        "outputs at the top level": with_ids(config, top=[1, 2, 3]),
        "out of order: sorted": with_ids(config, nested=[4, 2, 3]),
    }
    results = {way: drafted(tiny, write_head(tmp_path / str(i), c, tensors)) for i, (way, c) in enumerate(ways.items())}
    first = results["inputs of layers, under eagle_config"]
    for way, (checked, tokens, q) in results.items():
        assert checked.layers == (2, 3, 4), way
        assert torch.equal(tokens, first[1]) and torch.equal(q, first[2]), way
    default = drafted(tiny, write_head(tmp_path / "default", config, tensors))
    assert default[0].layers == (2, 2, 1) and not torch.equal(default[2], first[2])  # the layers do matter


def test_sglangs_rule_and_vllms_key_order_on_a_32_layer_target():
    def read(**keys: object) -> tuple[int, ...]:
        obj = {"hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100, **keys}
        return HeadConfig.from_json(obj).hidden_layers(32)

    assert read() == (2, 16, 29)
    assert read(eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 15, 28]}) == (2, 16, 29)  # SpecForge's
    assert read(eagle_aux_hidden_state_layer_ids=[2, 16, 29]) == (2, 16, 29)  # vLLM's
    assert read(eagle_aux_hidden_state_layer_ids=[1, 15, 31]) == (2, 16, 32)  # 32: the last layer's output
    assert read(eagle_aux_hidden_state_layer_ids=[0, 15, 28]) == (0, 15, 28)  # the embeddings, then inputs
    assert read(eagle_aux_hidden_state_layer_ids=[3, 1, 2],
                eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}) == (1, 2, 3)


def test_the_last_layers_output_is_read_before_the_final_norm(tiny):
    seen: list[torch.Tensor] = []
    hook = tiny.model.model.layers[-1].register_forward_hook(lambda _m, _a, output: seen.append(output))
    with torch.inference_mode(), hidden_states.reading(tiny.model, (0, 4)) as features_of:
        out = tiny.model(input_ids=torch.tensor([PROMPT]), output_hidden_states=True)
    hook.remove()
    features = features_of(out)
    assert torch.equal(features[..., :64], out.hidden_states[0]) and torch.equal(features[..., 64:], seen[0])
    normed = tiny.model.model.norm(seen[0])
    assert torch.equal(out.hidden_states[4], normed) and not torch.allclose(seen[0], normed)  # what HF's [4] is


def test_rotary_frequencies_stay_fp32_under_bf16_weights(tiny, tmp_path):
    config, tensors = published_config(64, VOCAB, DRAFT_IDS.numel()), published_tensors(64, VOCAB, DRAFT_IDS, 0)
    checked = head_files.check(str(write_head(tmp_path / "h", config, tensors)), tiny.model.config)
    head = head_files.load(checked, tiny.model.get_input_embeddings(), tiny.device, torch.bfloat16)
    assert head.fc.weight.dtype == torch.bfloat16 and head.rotary.inv_freq.dtype == torch.float32
    expected = 1.0 / (10000.0 ** (torch.arange(0, 16, 2, dtype=torch.float32) / 16))
    assert torch.equal(head.rotary.inv_freq, expected)


VARIANTS = {  # config.json entries over the published config, and what `check-head` reports of the layout
    "EAGLE-3": {},
    "norm_before_residual": {"norm_before_residual": True},
    "norm_before_fc": {"norm_before_fc": True},
    "fc_norm": {"fc_norm": True},
    "norm_output": {"norm_output": True},
    "EAGLE-3.1": {"fc_norm": True, "norm_output": True},
    "bias": {"bias": True},
    "attention_bias": {"attention_bias": True},
    "two layers": {"num_hidden_layers": 2},
    "three layers, biased": {"num_hidden_layers": 3, "attention_bias": True},
    "narrower, with its own embedding": {"hidden_size": 32, "target_hidden_size": 64, "intermediate_size": 64},
}


def variant_tensors(c: dict, seed: int) -> dict[str, torch.Tensor]:
    """Random fp32 weights under the names vLLM and SGLang load, norms and biases away from 1 and 0 so each counts."""
    g = torch.Generator().manual_seed(seed)
    h, wide = c["hidden_size"], c.get("target_hidden_size", c["hidden_size"])
    q, kv, inner = h, h // 2, c["intermediate_size"]

    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) / math.sqrt(shape[-1])

    def near(size: int, around: float) -> torch.Tensor:
        return around + 0.3 * torch.randn(size, generator=g)

    def layer(prefix: str, width: int) -> dict[str, torch.Tensor]:
        out = {f"{prefix}.self_attn.q_proj.weight": w(q, width), f"{prefix}.self_attn.k_proj.weight": w(kv, width),
               f"{prefix}.self_attn.v_proj.weight": w(kv, width), f"{prefix}.self_attn.o_proj.weight": w(h, q),
               f"{prefix}.mlp.gate_proj.weight": w(inner, h), f"{prefix}.mlp.up_proj.weight": w(inner, h),
               f"{prefix}.mlp.down_proj.weight": w(h, inner), f"{prefix}.input_layernorm.weight": near(h, 1),
               f"{prefix}.post_attention_layernorm.weight": near(h, 1)}
        if c.get("attention_bias"):
            sizes = {"q": q, "k": kv, "v": kv, "o": h}
            out |= {f"{prefix}.self_attn.{p}_proj.bias": near(n, 0) for p, n in sizes.items()}
        return out

    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[DRAFT_IDS] = True
    tensors = {"fc.weight": w(h, 3 * wide), **layer("midlayer", 2 * h), "midlayer.hidden_norm.weight": near(h, 1),
               "norm.weight": near(h, 1), "lm_head.weight": 3 * w(DRAFT_IDS.numel(), h),
               "d2t": DRAFT_IDS - torch.arange(DRAFT_IDS.numel()), "t2d": t2d}
    for i in range(1, c.get("num_hidden_layers", 1)):
        tensors |= layer(f"layers.{i}", h)
    if c.get("bias"):
        tensors["fc.bias"] = near(h, 0)
    if c.get("norm_before_fc"):
        tensors["input_norm.weight"] = near(3 * wide, 1)
    if c.get("fc_norm"):
        tensors |= {f"fc_norm.{i}.weight": near(wide, 1) for i in range(3)}
    if h != wide:
        tensors["embed_tokens.weight"] = torch.randn(VOCAB, h, generator=g)
    return tensors


@pytest.mark.parametrize("name", VARIANTS)
def test_each_variant_drafts_what_the_written_out_forward_computes(tiny, tmp_path, name):
    """Two drafts (the second reads the head's own output fed back) against `eagle_reference.two_drafts`."""
    config = published_config(64, VOCAB, DRAFT_IDS.numel()) | VARIANTS[name]
    tensors = variant_tensors(config, seed=3)
    checked, tokens, q = drafted(tiny, write_head(tmp_path / "head", config, tensors), k=2)
    t = {n: v.double() for n, v in tensors.items() if v.is_floating_point()}
    t.setdefault("embed_tokens.weight", tiny.model.get_input_embeddings().weight.double())
    with torch.inference_mode():
        features = target_features(tiny, checked.layers, torch.tensor(PROMPT[:-1]))
    scores = two_drafts(t, config, features[0].double(), torch.tensor(PROMPT), int(tokens[0]))
    for step, expected_scores in enumerate(scores):
        expected = torch.zeros(VOCAB, dtype=torch.float64)
        expected[DRAFT_IDS] = expected_scores.softmax(-1)
        assert float(expected.max()) < 0.9  # spread: a wrong forward cannot hide behind one certain token
        torch.testing.assert_close(q[step].double(), expected, atol=2e-5, rtol=1e-3)


class RunsCode:
    """A pickle that would create a file when unpickled without weights_only."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (Path.touch, (self.marker,))


def refused_heads(root: Path) -> dict[str, tuple[Path, str]]:
    """name -> (the head, the exact line check-head prints); each head is wrong in one way."""
    config, tensors = published_config(64, VOCAB, DRAFT_IDS.numel()), published_tensors(64, VOCAB, DRAFT_IDS, 0)
    narrow = published_config(64, VOCAB, DRAFT_IDS.numel()) | VARIANTS["narrower, with its own embedding"]
    flags = ("num_hidden_layers=1, norm_before_residual=False, norm_before_fc=False, fc_norm=False, "
             "norm_output=False, bias=False, attention_bias=False")
    cases: dict[str, tuple[Path, str]] = {}

    def case(name: str, message: str, c: dict = config, t: dict = tensors) -> Path:
        path = write_head(root / name.replace(" ", "-"), c, t)
        cases[name] = (path, message.format(p=path))
        return path

    case("a tensor the layout does not read", "{p}: tensor midlayer.self_attn.o_proj.bias is not read by this "
         f"head's layout ({flags}); refused, not dropped",
         t=tensors | {"midlayer.self_attn.o_proj.bias": torch.zeros(64).half()})
    case("mlp_bias", "{p}/config.json: mlp_bias is set: MLP biases are not supported", c=config | {"mlp_bias": True})
    case("both fc norms", "{p}/config.json: both fc_norm and norm_before_fc are set: the features would be normed "
         "twice", c=config | {"fc_norm": True, "norm_before_fc": True})
    case("narrower without its own embedding", "{p}: the head is 32 wide and the target's embedding 64: a head of "
         "another width must carry its own embed_tokens.weight",
         c=narrow, t={n: v for n, v in variant_tensors(narrow, 0).items() if n != "embed_tokens.weight"})
    case("two layer ids", "{p}/config.json: eagle_config.eagle_aux_hidden_state_layer_ids must name 3 layers, it "
         "names 2", c=with_ids(config, nested=[2, 3]))
    case("a layer past the target's", "{p}: the head reads hidden states [2, 3, 5], the target has 4 layers, so "
         "hidden states 0 to 4", c=with_ids(config, top=[2, 3, 5]))
    case("a speculators config", "{p}/config.json: a speculators-format config (transformer_layer_config, "
         "speculators_config) is not read here; the published EAGLE-3 format is",
         c={"architectures": ["Eagle3Speculator"], "transformer_layer_config": config, "speculators_config": {}})
    case("a flag that is not a boolean", "{p}/config.json: a field has the wrong type", c=config | {"bias": "yes"})
    case("no d2t", "{p}: no tensor d2t, which a draft vocabulary smaller than the target's needs",
         t={n: v for n, v in tensors.items() if n not in ("d2t", "t2d")})
    case("a t2d that disagrees with d2t", "{p}: t2d does not mark exactly the target tokens d2t maps the draft "
         "vocabulary onto", t=tensors | {"t2d": tensors["t2d"].roll(1)})
    shards = write_shards(root / "a-missing-shard", config, tensors, "safetensors")
    (shards / "model-00002-of-00002.safetensors").unlink()
    cases["a missing shard"] = (shards, f"{shards}/model.safetensors.index.json: names "
                                "model-00002-of-00002.safetensors, which is not there")
    code = root / "a-pickle-that-runs-code"
    code.mkdir()
    (code / "config.json").write_text(json.dumps(config))
    torch.save(tensors | {"extra": RunsCode(root / "ran")}, code / "pytorch_model.bin")
    cases["a pickle that runs code"] = (code, f"{code}/pytorch_model.bin: not a PyTorch state dict of plain tensors "
                                        "(read with weights_only)")
    return cases


def test_check_head_refuses_in_one_exact_line_with_exit_2_and_no_traceback(tiny_dir, tmp_path):
    for name, (path, message) in refused_heads(tmp_path).items():
        result = CliRunner().invoke(app, ["check-head", str(path), "--target", str(tiny_dir)])
        assert result.exit_code == 2, (name, result.output)
        assert result.stderr.strip() == f"error: {message}", name
        assert "Traceback" not in result.output and result.stdout == "", name
    assert not (tmp_path / "ran").exists()  # weights_only: the pickle's code never ran


def test_check_head_tells_the_layout_the_layers_the_vocabulary_and_the_flags(tiny_dir, tmp_path):
    config = with_ids(published_config(64, VOCAB, DRAFT_IDS.numel()), nested=[1, 2, 3]) | {"fc_norm": True}
    tensors = {n: v for n, v in variant_tensors(config, 0).items() if n != "t2d"}
    path = tmp_path / "head"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    torch.save(tensors, path / "pytorch_model.bin")
    result = CliRunner().invoke(app, ["check-head", str(path), "--target", str(tiny_dir)])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        f"head: {path}",
        "weights: pytorch_model.bin, 17 tensors, every one read",
        "layout: EAGLE-3, the midlayer; width 64, reading target features of width 64; embedding: the target's",
        "target layers: hidden states [2, 3, 4] of a 4-layer target (4: the last layer's output, before the final "
        "norm), from eagle_config.eagle_aux_hidden_state_layer_ids [1, 2, 3]: outputs of layers (first id 1: "
        "SGLang's and SpecForge's convention), each + 1",
        "vocabulary: 1229 draft tokens of the target's 49152; t2d derived from d2t",
        "flags: num_hidden_layers=1, norm_before_residual=False, norm_before_fc=False, fc_norm=True, "
        "norm_output=False, bias=False, attention_bias=False",
        f"refused: nothing; loads as eagle:{path}",
    ]


def test_the_command_line_refuses_a_head_in_one_line(tiny_dir, tmp_path):
    """As a user runs it: a separate process, exit code 2, one line on stderr, nothing on stdout."""
    path, message = refused_heads(tmp_path)["a tensor the layout does not read"]
    env = os.environ | {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "COLUMNS": "400"}
    done = subprocess.run([sys.executable, "-m", "runner", "check-head", str(path), "--target", str(tiny_dir)],
                          capture_output=True, text=True, env=env, cwd=Path(__file__).resolve().parents[2], timeout=300)
    assert (done.returncode, done.stdout, done.stderr.strip()) == (2, "", f"error: {message}")
