"""The replay's tokenizer: read by the `tokenizers` library alone where the files allow, decoding every token as
transformers does."""

from __future__ import annotations

import json
import subprocess
import sys

from dashboard import tokenizer
from runner.engine.weights import models, sources


def test_every_token_of_the_default_model_decodes_as_transformers_decodes_it():
    models.load_tokenizer(models.DEFAULT_MODEL)  # converts the shipped GGUF file once, if no test did yet
    assert sources.plain_tokenizer_file(models.DEFAULT_MODEL) is not None
    plain = tokenizer.load(models.DEFAULT_MODEL)
    full = models.load_tokenizer(models.DEFAULT_MODEL)
    ids = range(len(full))
    assert [plain(i) for i in ids] == [full.decode([i]) for i in ids]
    assert plain(full.eos_token_id) == "<|im_end|>"  # special tokens are shown, not dropped


def test_the_plain_path_imports_neither_torch_nor_transformers():
    models.load_tokenizer(models.DEFAULT_MODEL)
    code = ("import sys; from dashboard import tokenizer; decode = tokenizer.load('smollm2-135m'); "
            "print(decode(28), 'torch' in sys.modules, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == [models.load_tokenizer(models.DEFAULT_MODEL).decode([28]), "False", "False"]


def test_files_that_need_transformers_are_left_to_it(tmp_path):
    assert sources.plain_tokenizer_file(str(tmp_path)) is None  # no tokenizer.json
    (tmp_path / "tokenizer.json").write_text("{}")
    assert sources.plain_tokenizer_file(str(tmp_path)) == tmp_path / "tokenizer.json"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"clean_up_tokenization_spaces": True}))
    assert sources.plain_tokenizer_file(str(tmp_path)) is None
    assert sources.plain_tokenizer_file("HuggingFaceTB/SmolLM2-135M") is None  # a repo id: transformers finds it
    assert sources.plain_tokenizer_file(str(tmp_path / "missing.gguf")) is None
