"""`--engine`: which engine decodes (ours, or vLLM: runner/vllm/), and the drafts and policies checked against it
before anything runs."""

from __future__ import annotations

from typing import Annotated

import typer

from runner.cli.shared import UsageError
from runner.engine.drafters.spec import DraftSpec
from runner.engine.round.policies import FIXED, PolicySpec
from runner.vllm import drafts as vllm_drafts

OURS = "specdash"
Engine = Annotated[str, typer.Option(
    help="specdash (ours), vllm (run here from .venv-vllm, an engine per speculative config) or vllm:<url> "
         "(a vLLM server already running there, started with --per-request-spec-decode-metrics detailed)")]


def check_engine(engine: str) -> str:
    if engine == OURS or engine == "vllm" or engine.startswith(("vllm:http://", "vllm:https://")):
        return engine
    raise UsageError(f'unknown engine "{engine}"; use specdash, vllm or vllm:<url> (http://host:port)')


def vllm_drafts_for(drafts: list[str], policies: list[str]) -> tuple[tuple[DraftSpec, ...], tuple[PolicySpec, ...]]:
    """The drafts vLLM runs, parsed; a draft or policy it cannot run refused in one line."""
    if any(p != FIXED.text for p in policies):
        raise UsageError(f"vLLM drafts a fixed k every step: --k-policy {FIXED.text} only")
    specs = tuple(vllm_drafts.parse(d) for d in drafts)
    if any(s.baseline for s in specs):
        raise UsageError("every sweep records its baselines; give only drafts")
    return specs, (FIXED,)
