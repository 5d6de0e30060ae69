"""Shared fixtures (fixtures only; helpers are imported from tests/helpers/): the real default model, tiny random
models saved as real HF directories, a browser, and the order `make test` hands files out in."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch
from tokenizers import Tokenizer, pre_tokenizers
from tokenizers import models as tok_models
from transformers import PreTrainedTokenizerFast

from runner.engine.weights import models
from tests.helpers.tiny import tiny_llama

if TYPE_CHECKING:  # playwright is imported by the browser fixture alone: the GPU check runs tests without it
    from playwright.sync_api import Browser

# One torch thread in the test process: on a busy 2-core machine two threads wait on each other at every
# matmul (a SmolLM2 pass measured ~0.1 s on one thread, over 1 s on two), and the sweeps the tests start in
# subprocesses run on one thread too (tests/helpers/reliability_helpers.py, child_env). OMP_NUM_THREADS is the
# commands' default (`--threads`), so an in-process `runner sweep` keeps to one thread as well.
os.environ["OMP_NUM_THREADS"] = "1"
torch.set_num_threads(1)


# The files that take longest, run first: `make test` hands whole files to its workers in this order, so the long
# ones start at once and the short ones fill in around them, instead of one long file running alone at the end.
LONGEST_FIRST = ("vllm/test_real_vllm.py", "end_to_end/test_ray.py", "reliability/test_reliability_load.py",
                 "engine/test_reference.py", "end_to_end/test_browser.py", "engine/test_families.py",
                 "dashboard/test_login.py", "engine/test_medusa.py", "engine/test_lookahead.py",
                 "engine/test_trees_sampling.py", "engine/test_policies.py", "engine/test_sampling_smollm2.py",
                 "reliability/test_reliability_crash.py", "reliability/test_reliability_concurrency.py",
                 "store/test_store.py", "dashboard/test_dashboard_app.py", "engine/test_heads.py",
                 "engine/test_tree_drafters.py", "engine/test_sampling.py", "end_to_end/test_serve.py")
TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    # stable: each file keeps its own order
    items.sort(key=lambda item: rank.get(item.path.resolve().relative_to(TESTS).as_posix(), len(rank)))


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


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Debian's Chromium headless shell, once per browser test file."""
    from playwright.sync_api import sync_playwright

    from tests.helpers.browser import CHROMIUM, TEST_LAUNCH_ARGS

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=TEST_LAUNCH_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()
