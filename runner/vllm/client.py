"""One request over vLLM's OpenAI-compatible HTTP API: the prompt as token ids in, the output's token ids and the
request's verify steps out (`vllm/entrypoints/openai/completion/protocol.py`; the metrics are
`vllm/entrypoints/generate/base/protocol.py`'s `PerRequestMetrics`)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass

from runner.vllm.process import VllmError


@dataclass(frozen=True)
class Steps:
    """What vLLM reports of one request's speculative decoding (`metrics.speculative_decoding`)."""

    accepted: tuple[int, ...]  # per verify step, drafts accepted (the bonus not counted)
    drafted: tuple[int, ...]  # per verify step, drafts proposed
    num_spec_tokens: int  # the configured k
    num_accepted_draft_tokens: int  # vLLM's own totals, which the steps must sum to
    num_draft_tokens: int
    mean_acceptance_length: float  # vLLM's: 1 + accepted per verify step, over the steps that drafted only
    draft_acceptance_rate: float  # vLLM's: accepted / drafted (thrown drafts counted), not α


@dataclass(frozen=True)
class Reply:
    """A finished request."""

    output_ids: tuple[int, ...]
    finish_reason: str  # vLLM's: 'stop' (EOS) or 'length' (max_tokens)
    ttft_s: float  # scheduled to first token: the prefill
    generation_s: float  # first token to last
    steps: Steps | None  # None: the server decodes plainly
    report: dict | None  # `metrics.speculative_decoding` as vLLM returned it


def get(url: str, path: str, timeout_s: float = 30.0) -> dict:
    try:
        with urllib.request.urlopen(f"{url}{path}", timeout=timeout_s) as reply:
            return json.loads(reply.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise VllmError(f"no vLLM server answers at {url}: {exc}") from None


def complete(url: str, model: str, ids: list[int], max_tokens: int, sampling: dict, timeout_s: float) -> Reply:
    """Decode `ids` (already chat-templated: sent as token ids, so vLLM tokenizes nothing) up to `max_tokens` new
    tokens or EOS; `sampling` holds temperature, top_p and seed."""
    body = {"model": model, "prompt": ids, "max_tokens": max_tokens, "ignore_eos": False, "return_token_ids": True,
            "skip_special_tokens": False, **sampling}
    request = urllib.request.Request(f"{url}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as reply:
            answer = json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        raise VllmError(f"vLLM refused the request: {_message(exc)}") from None
    except (urllib.error.URLError, OSError) as exc:  # TimeoutError is an OSError
        raise VllmError(f"vLLM did not answer: {exc}") from None
    return reply_of(answer)


def _message(exc: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(exc.read()).get("error", {}).get("message", exc)).splitlines()[0]
    except (ValueError, AttributeError):
        return str(exc)


def reply_of(answer: dict) -> Reply:
    """A completion's response read; VllmError when it lacks the token ids or the timings."""
    choice, metrics = answer["choices"][0], answer.get("metrics") or {}
    if choice.get("token_ids") is None:
        raise VllmError("vLLM's response has no token ids (this vLLM predates return_token_ids)")
    if metrics.get("time_to_first_token_ms") is None:
        raise VllmError("vLLM's response has no timings: start it with --enable-per-request-metrics")
    spec = metrics.get("speculative_decoding")
    steps = None
    if spec is not None:
        if spec.get("per_step_accepted") is None:
            raise VllmError("vLLM's response has no per-step metrics: start it with "
                            "--per-request-spec-decode-metrics detailed")
        steps = Steps(tuple(spec["per_step_accepted"]), tuple(spec["per_step_drafted"]), spec["num_spec_tokens"],
                      spec["num_accepted_draft_tokens"], spec["num_draft_tokens"], spec["mean_acceptance_length"],
                      spec["draft_acceptance_rate"])
    return Reply(tuple(choice["token_ids"]), choice.get("finish_reason") or "length",
                 metrics["time_to_first_token_ms"] / 1000, (metrics.get("generation_time_ms") or 0.0) / 1000, steps,
                 spec)
