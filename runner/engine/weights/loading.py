"""What can go wrong loading a model, said in one line before it costs anything: a Hub that refuses or cannot be
reached, weights that will not fit the device, a checkpoint that leaves weights at random."""

from __future__ import annotations

from pathlib import Path

import torch
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
)
from huggingface_hub.utils import httpx  # the HTTP client the Hub library itself uses
from transformers import AutoModelForCausalLM, PretrainedConfig

# Weights may take this share of the free memory; the rest is for the KV cache, activations and the CUDA context.
FIT_SHARE = 0.9
GIB = 2**30


def _chain(exc: BaseException) -> list[BaseException]:
    """The exception and everything it was raised from (transformers wraps the Hub's errors in OSError)."""
    seen: list[BaseException] = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def hub_problem(exc: BaseException, spec: str, offline: bool) -> str:
    """One line saying why `spec` could not be fetched: gated, not found or private, network, or offline."""
    chain = _chain(exc)

    def has(*kinds: type) -> BaseException | None:
        return next((e for e in chain if isinstance(e, kinds)), None)

    if has(GatedRepoError):
        return f'"{spec}" is a gated repository: ask for access on its Hub page, then log in (hf auth login, HF_TOKEN)'
    if has(RepositoryNotFoundError):
        return f'"{spec}" is not on the Hub, or it is private and no token with access was given (HTTP 401/404)'
    if network := has(httpx.TransportError, OfflineModeIsEnabled):
        reason = str(network).strip().splitlines()[0] if str(network).strip() else type(network).__name__
        return f'cannot reach the Hub for "{spec}" ({reason}), and it is not in the local Hugging Face cache'
    if (http := has(HfHubHTTPError)) and http.response is not None:
        return f'the Hub answered HTTP {http.response.status_code} for "{spec}"'
    if offline and has(LocalEntryNotFoundError):
        return (f'"{spec}" is not in the local Hugging Face cache, and downloads are off '
                "(HF_HUB_OFFLINE=0 allows them)")
    return f'"{spec}": no such directory, and not in the local Hugging Face cache'


def weight_bytes(config: PretrainedConfig, dtype: torch.dtype, trust_remote_code: bool) -> int:
    """Bytes of the model's parameters and buffers in `dtype`, counted on the meta device (nothing allocated)."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * (dtype.itemsize if t.is_floating_point() else t.element_size()) for t in tensors)


def free_bytes(device: torch.device) -> int | None:
    """Memory free on the device: CUDA's own count, or the host's available memory; None if unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    meminfo = Path("/proc/meminfo")
    if device.type != "cpu" or not meminfo.is_file():
        return None
    fields = dict(line.split(":", 1) for line in meminfo.read_text().splitlines() if ":" in line)
    return int(fields["MemAvailable"].split()[0]) * 1024 if "MemAvailable" in fields else None


def fit_problem(spec: str, needed: int, free: int | None, device: torch.device, dtype: torch.dtype) -> str | None:
    """One line when the weights would not leave room to decode, else None."""
    if free is None or needed <= FIT_SHARE * free:
        return None
    name = str(dtype).removeprefix("torch.")
    return (f'"{spec}" does not fit: its weights need {needed / GIB:.1f} GiB in {name} and {device} has '
            f"{free / GIB:.1f} GiB free ({FIT_SHARE:.0%} of it may go to weights)")


def random_weights_problem(spec: str, info: dict) -> str | None:
    """One line when the checkpoint left weights missing or of the wrong shape: they would be random."""
    missing = sorted(info.get("missing_keys") or [])
    mismatched = sorted(str(m[0] if isinstance(m, tuple) else m) for m in info.get("mismatched_keys") or [])
    if not missing and not mismatched:
        return None
    example = (missing or mismatched)[0]
    return (f'"{spec}": {len(missing)} weight(s) missing from the checkpoint and {len(mismatched)} of the wrong '
            f"shape (e.g. {example}) would be initialised at random; refusing to run it")
