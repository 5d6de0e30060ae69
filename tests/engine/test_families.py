"""The model families users bring (tests/helpers/families.py), each through greedy and sampled sweeps with model:,
layerskip: and ngram drafts: lossless where it must be, exact in law when sampling, or refused in one line.

SPECDASH_FAMILY_DEVICE and SPECDASH_FAMILY_DTYPE run the same matrix on a GPU (bench/gpu_check.sh): greedy
mismatches are then allowed, but each must be classified, and none may be called real where the same step
recomputed in float32 agrees with the speculative run. Exact equality is required in float32 on a CPU.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import duckdb
import pytest
import torch
from rich.console import Console
from scipy.stats import chisquare

from runner.engine.drafters.model import ModelDrafter, layer_skip
from runner.engine.drafters.registry import parse_draft
from runner.engine.round.decode import generate
from runner.engine.round.decoding_rule import Decoding
from runner.engine.round.sampling import probabilities
from runner.engine.weights import models
from runner.prompts import load_prompts
from runner.sweep.loop import run_sweep
from runner.sweep.plan import SweepConfig
from tests.helpers.families import FAMILIES, Family, prompt_text, save

DEVICE = os.environ.get("SPECDASH_FAMILY_DEVICE")  # None: the runner's default (cpu here)
DTYPE = os.environ.get("SPECDASH_FAMILY_DTYPE")  # None: float32 on a CPU
GREEDY = Decoding("greedy", 0.0, 1.0)
SAMPLE = Decoding("sample", 0.8, 0.9)
# Concentrated enough that the exact joint law of two tokens has ~20 outcomes, each seen often in 400 draws.
EXACTNESS = Decoding("sample", 0.5, 0.8)
NEW_TOKENS = 20  # every prompt is ~40 tokens: with the output, five windows of 8


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """Per family: (target with 6 layers, a 2-layer draft of the same family), sharing one tokenizer."""
    root = tmp_path_factory.mktemp("families")
    return {f.name: (save(f, root / f.name, 6, f.target_vocab, seed=1), save(f, root / f"{f.name}-draft", 2,
                                                                               f.draft_vocab, seed=2))
            for f in FAMILIES}


def _rows(db: Path, sql: str) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql).fetchall()


def _no_cache_greedy(target: models.Loaded, prompt: list[int], n: int) -> list[int]:
    """Plain greedy decoding by an independent path: a full forward over the whole text for every token."""
    text, out = list(prompt), []
    with torch.inference_mode():
        for _ in range(n):
            token = int(target.model(input_ids=torch.tensor([text], device=target.device)).logits[0, -1,
                                                                                                  :target.vocab_size].argmax())
            out.append(token)
            text.append(token)
            if token in target.eos_ids:
                break
    return out


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_every_family_sweeps_losslessly_with_every_kind_of_draft(family: Family, family_dirs, tmp_path):
    target_dir, draft_dir = family_dirs[family.name]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "category": c, "prompt": prompt_text(24, i)}) + "\n"
                               for i, c in enumerate(["code", "poem"])))
    config = SweepConfig(
        target=str(target_dir), drafts=tuple(map(parse_draft, ("ngram", "layerskip:2", f"model:{draft_dir}"))),
        ks=(1, 4),
        decodings=(GREEDY, SAMPLE), prompts=tuple(load_prompts(prompts)), max_new_tokens=NEW_TOKENS, seed=3,
        db=tmp_path / "runs.duckdb", device=DEVICE, dtype=DTYPE,
    )
    _, recorder = run_sweep(config, Console(quiet=True))
    assert recorder.errors == []
    db = config.db
    # 2 prompts × 2 modes × (baseline + 3 drafts × 2 k), all ok
    assert _rows(db, "SELECT status, count(*) FROM runs GROUP BY ALL") == [("ok", 28)]
    # the sliding window (8) is overrun long before the end: prompt + output
    assert _rows(db, "SELECT min(len(prompt_tokens)) FROM runs")[0][0] > 3 * 8
    # every token written is one the tokenizer has, whatever the heads' padding
    target = models.load(str(target_dir), DEVICE, DTYPE)
    assert _rows(db, "SELECT max(list_max(output_tokens)) FROM runs")[0][0] < target.vocab_size
    if target.dtype == torch.float32 and target.device.type == "cpu":  # GPU kernels may split sums by width
        assert _rows(db, "SELECT mode, lossless, count(*) FROM runs WHERE draft <> 'none' GROUP BY ALL ORDER BY ALL") \
            == [("greedy", True, 12), ("sample", None, 12)]
        # and plain greedy itself equals decoding by full forwards without a cache
        (prompt, output), = _rows(db, "SELECT prompt_tokens, output_tokens FROM runs WHERE draft = 'none' "
                                      "AND mode = 'greedy' AND prompt_id = 'p0'")
        assert output == _no_cache_greedy(target, prompt, NEW_TOKENS)
    else:
        _check_low_precision_mismatches(db, target_dir)


def _check_low_precision_mismatches(db: Path, target_dir: Path) -> None:
    """Each greedy mismatch is classified, and a 'real' one is never a step that float32 decides the speculative
    run's way."""
    mismatches = _rows(db, """SELECT r.prompt_tokens, r.output_tokens, b.output_tokens, r.divergence_at, r.divergence
        FROM runs r JOIN runs b ON b.run_id = r.baseline_run_id WHERE r.lossless = false""")
    assert all(kind in ("tie", "real") for *_, kind in mismatches)
    reference = models.load(str(target_dir), DEVICE, "float32")
    for prompt, output, baseline, at, kind in mismatches:
        if kind == "real":
            ids = torch.tensor([prompt + baseline[:at]], device=reference.device)
            with torch.inference_mode():
                logits = reference.model(input_ids=ids).logits[0, -1, : reference.vocab_size]
            assert int(logits.argmax()) != output[at], (at, kind)


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_every_family_samples_the_targets_law_through_a_model_draft(family: Family, family_dirs):
    """The joint law of the two tokens after the prefill's (one speculative round of k = 2 with the family's draft,
    whose head may be padded differently) equals the target's, computed exactly by full forward passes."""
    target_dir, draft_dir = family_dirs[family.name]
    target, draft = models.load(str(target_dir), DEVICE, DTYPE), models.load(str(draft_dir), DEVICE, DTYPE)
    prompt = models.encode_chat(target, prompt_text(8, 5))[:12]  # longer than the window of 8
    n, vocab = 400, target.vocab_size
    counts: dict[tuple[int, int], int] = {}
    for seed in range(n):
        gen = torch.Generator(device=target.device).manual_seed(seed)
        drafter = ModelDrafter(draft.model, EXACTNESS, gen, vocab)
        out = generate(target, drafter, prompt, 2, EXACTNESS, 3, gen).output_tokens
        counts[out[1:3]] = counts.get(out[1:3], 0) + 1
    law = _exact_law(target, prompt)
    expected = {pair: p * n for pair, p in law.items()}
    big = [pair for pair, e in expected.items() if e >= 5]  # chi-square needs 5 or more; the rest is pooled
    seen = [counts.get(pair, 0) for pair in big] + [n - sum(counts.get(pair, 0) for pair in big)]
    want = [expected[pair] for pair in big] + [n - sum(expected[pair] for pair in big)]
    if want[-1] < 5:  # too little left to pool on its own: it joins the last outcome
        seen, want = seen[:-2] + [seen[-2] + seen[-1]], want[:-2] + [want[-2] + want[-1]]
    assert set(counts) <= set(law)  # nothing outside the target's top-p support
    assert len(big) >= 5  # the law is spread over several outcomes, so the test means something
    assert chisquare(seen, [w / sum(want) * n for w in want]).pvalue > 1e-3


def _exact_law(target: models.Loaded, prompt: list[int]) -> dict[tuple[int, int], float]:
    """P(x2, x3) = Σ_x1 p(x1) p(x2 | x1) p(x3 | x1, x2) under EXACTNESS, over the branches top-p keeps."""
    def law(texts: list[list[int]]) -> torch.Tensor:
        with torch.inference_mode():
            logits = target.model(input_ids=torch.tensor(texts, device=target.device)).logits[:, -1, :target.vocab_size]
        return probabilities(logits.float(), EXACTNESS).cpu()

    joint: dict[tuple[int, int], float] = {}
    p1 = law([prompt])[0]
    for x1 in p1.nonzero().view(-1).tolist():
        p2 = law([prompt + [x1]])[0]
        seconds = p2.nonzero().view(-1).tolist()
        p3 = law([prompt + [x1, x2] for x2 in seconds])
        for row, x2 in enumerate(seconds):
            for x3 in p3[row].nonzero().view(-1).tolist():
                joint[(x2, x3)] = joint.get((x2, x3), 0.0) + float(p1[x1] * p2[x2] * p3[row, x3])
    return joint


def test_layer_skip_inside_a_multimodal_wrapper_is_its_text_decoders_first_layers(family_dirs):
    target = models.load(str(family_dirs["gemma3-multimodal"][0]))
    draft = layer_skip(target.model, 2)
    # the wrapper and its vision tower stay; the text decoder inside is cut; the target is untouched
    assert type(draft) is type(target.model) and draft.model.vision_tower is target.model.model.vision_tower
    assert len(draft.model.language_model.layers) == 2 and len(target.model.model.language_model.layers) == 6
    assert draft.config.text_config.num_hidden_layers == 2 and target.model.config.text_config.num_hidden_layers == 6
    assert draft.config.text_config.layer_types == target.model.config.text_config.layer_types[:2]
    ids = torch.tensor([models.encode_chat(target, prompt_text(10, 1))])
    with torch.inference_mode():
        got = draft(input_ids=ids).logits[0]
        # independently: the full target's hidden state after its 2nd layer, through its final norm and head
        hidden = target.model(input_ids=ids, output_hidden_states=True).hidden_states[2][0]
        want = target.model.lm_head(target.model.model.language_model.norm(hidden))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
