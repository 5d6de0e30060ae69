"""Shared fixtures: the real default model, and tiny random models saved as real HF directories."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch
from tokenizers import Tokenizer, pre_tokenizers
from tokenizers import models as tok_models
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from bench.load import CHROMIUM, LAUNCH_ARGS
from runner.engine.weights import models

if TYPE_CHECKING:  # playwright is imported by the browser fixture alone: the GPU check runs tests without it
    from playwright.sync_api import Browser

# One torch thread in the test process: on a busy 2-core machine two threads wait on each other at every
# matmul (a SmolLM2 pass measured ~0.1 s on one thread, over 1 s on two), and the sweeps the tests start in
# subprocesses run on one thread too (reliability_helpers.child_env). OMP_NUM_THREADS is the commands' default
# (`--threads`), so an in-process `runner sweep` keeps to one thread as well.
os.environ["OMP_NUM_THREADS"] = "1"
torch.set_num_threads(1)


# The files that take longest, run first: `make test` hands whole files to its workers in this order, so the long
# ones start at once and the short ones fill in around them, instead of one long file running alone at the end.
LONGEST_FIRST = ("test_reliability_crash.py", "test_reliability_load.py", "test_reference.py",
                 "test_reliability_concurrency.py", "test_ray.py", "test_browser.py",
                 "test_families.py", "test_sampling_smollm2.py", "test_heads.py", "test_trees_sampling.py",
                 "test_trees.py", "test_tree_drafters.py", "test_serve.py", "test_policies.py", "test_sampling.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file keeps its own order


def tiny_llama(vocab_size: int, seed: int, layers: int = 2) -> LlamaForCausalLM:
    """A seeded random Llama small enough to decode in milliseconds, whose greedy text depends on the prompt.

    The LM head is its own matrix: tied to the embeddings, a random model scores the token it was just fed
    highest and repeats the prompt's last token forever, which hides cache, position and rollback bugs.
    """
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).eval()


def greedy_without_cache(model: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
    """The argmax after the whole text, one full forward pass per token: no cache, nothing shared with decode."""
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(n):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


@pytest.fixture(scope="session")
def smollm2() -> models.Loaded:
    return models.load(models.DEFAULT_MODEL)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory, smollm2: models.Loaded) -> Path:
    """A tiny random model with SmolLM2's tokenizer, so it can draft for SmolLM2 and vice versa."""
    path = tmp_path_factory.mktemp("tiny")
    model = tiny_llama(len(smollm2.tokenizer), seed=1, layers=4)
    model.generation_config.eos_token_id = smollm2.tokenizer.eos_token_id
    model.save_pretrained(path)
    smollm2.tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny(tiny_dir: Path) -> models.Loaded:
    return models.load(str(tiny_dir))


@pytest.fixture(scope="session")
def foreign_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model whose tokenizer is not SmolLM2's: a draft for SmolLM2 must be refused."""
    path = tmp_path_factory.mktemp("foreign")
    vocab = {f"w{i}": i for i in range(100)} | {"[UNK]": 100}
    core = Tokenizer(tok_models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]", eos_token="w0").save_pretrained(path)
    tiny_llama(101, seed=2).save_pretrained(path)
    return path


# The tests' Chromium runs V8 without its optimising compilers: the pages' scripts run once or twice, so compiling
# them costs more than it saves. Twenty sessions at once took less CPU so (102 and 114 CPU s against 117 and 123 on
# 2 cores, two runs each); the pages and what the tests assert of them are the same. The benches keep the default.
TEST_LAUNCH_ARGS = [*LAUNCH_ARGS, "--js-flags=--jitless"]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Debian's Chromium headless shell, once per browser test file."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=TEST_LAUNCH_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()
