"""vLLM as an engine: prompts chat-templated as ours are, each cell sent as a request to a vLLM server running its
speculative config, each finished request a `Generation` whose rounds are vLLM's verify steps.

One class (`VllmEngine`) meets the engine seam: `name`, `prompt_ids`, `run`, `run_batch`, `facts`, `close`.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from runner.cells import Cell
from runner.engine.weights.sources import DEFAULT_MODEL, converted_dir, smollm2_gguf
from runner.prompts import Prompt
from runner.records import Generation
from runner.vllm import client
from runner.vllm.drafts import VllmRefusal, speculative_config
from runner.vllm.server import Server, ServerSettings, VllmError, vllm_python
from runner.vllm.steps import rounds_of

REQUEST_TIMEOUT_S = 600.0  # one request; past it the run is an error run and the sweep goes on


def model_dir(spec: str) -> str:
    """What vLLM loads for a model spec: the directory specdash writes for a GGUF file (written first if missing),
    else the spec itself (a directory or a cached repo id)."""
    if spec != DEFAULT_MODEL and not spec.endswith(".gguf"):
        return str(Path(spec).expanduser()) if spec.startswith("~") else spec
    gguf = smollm2_gguf() if spec == DEFAULT_MODEL else Path(spec)
    if not (converted_dir(gguf) / "config.json").is_file():
        from runner.engine.models import dequantized  # torch only here: once per GGUF file and machine

        dequantized(gguf)
    return str(converted_dir(gguf))


class VllmEngine:
    """A target decoded by vLLM: servers started here, one per speculative config (the previous one stopped), or
    the server a team runs at `url`, whose config is the one the cells state."""

    name = "vllm"

    def __init__(self, target: str, url: str | None = None, threads: int = 1) -> None:
        self.target, self.url, self.threads = target, url, threads
        if url is None:
            vllm_python()  # no environment: one line naming what builds it, before any tokenizer is read
        self.model = model_dir(target)
        self.tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(self.model, local_files_only=True)
        self.server: Server | None = None
        self.config: dict | None = None  # the speculative config of the cells now running
        self.served = client.get(url, "/v1/models")["data"][0]["id"] if url else None
        self.version = client.get(url, "/version").get("version") if url else None

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        """The ids our engine feeds for the prompt: its chat template applied, ready for the answer."""
        if prompt.history:
            raise VllmRefusal(f'prompt "{prompt.id}" is a later turn: vLLM runs single-turn prompts only')
        messages = [{"role": "user", "content": prompt.text}]
        if getattr(self.tokenizer, "chat_template", None):
            return list(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                           return_dict=True)["input_ids"])
        return list(self.tokenizer(prompt.text)["input_ids"])

    def use(self, cell: Cell, warm_ids: list[int], max_new_tokens: int) -> None:
        """Make the cell's speculative config the one requests run with: a new server here when it changed, warmed
        up by decoding `warm_ids` once (its first requests pay one-off costs: the n-gram matcher's JIT, allocations),
        as our engine warms up before its timed runs."""
        config = speculative_config(cell.draft, cell.k, model_dir)
        if self.url or (self.server is not None and config == self.config):
            self.config = config
            return
        self.close()
        self.config = config
        self.server = Server(ServerSettings(self.model, self.threads), config)
        self.server.wait()
        self.served = self.model
        self.version = client.get(self.server.url, "/version").get("version")
        client.complete(self.server.url, self.served, warm_ids, max_new_tokens, {"temperature": 0.0},
                        REQUEST_TIMEOUT_S)

    def run(self, cell: Cell, ids: list[int], max_new_tokens: int, seed: int) -> Generation:
        """One request: the cell's prompt ids decoded under its config (`use` first)."""
        return self.request(cell, ids, max_new_tokens, seed)[0]

    def run_batch(self, cells: list[Cell], ids_list: list[list[int]], max_new_tokens: int,
                  seed: int) -> list[Generation]:
        """B requests at once, which vLLM schedules into the same steps."""
        return [g for g, _ in self.request_batch(cells, ids_list, max_new_tokens, seed)]

    def request(self, cell: Cell, ids: list[int], max_new_tokens: int, seed: int) -> tuple[Generation, str | None]:
        """`run`, with vLLM's own report of the request's speculative decoding (JSON; None when plain)."""
        if self.server is not None and (why := self.server.died()):
            raise VllmError(why)
        url = self.url or self.server.url
        d = cell.decoding
        sampling = {"temperature": 0.0, "top_p": 1.0} if d.greedy else {"temperature": d.temperature,
                                                                         "top_p": d.top_p, "seed": seed}
        reply = client.complete(url, self.served, ids, max_new_tokens, sampling, REQUEST_TIMEOUT_S)
        return self.generation(ids, reply, cell.k), None if reply.report is None else json.dumps(reply.report)

    def request_batch(self, cells: list[Cell], ids_list: list[list[int]], max_new_tokens: int,
                      seed: int) -> list[tuple[Generation, str | None]]:
        """`run_batch`, each with vLLM's report: B requests sent at once."""
        with ThreadPoolExecutor(len(cells)) as pool:
            return list(pool.map(lambda pair: self.request(pair[0], pair[1], max_new_tokens, seed),
                                 zip(cells, ids_list, strict=True)))

    def generation(self, ids: list[int], reply: client.Reply, k: int | None) -> Generation:
        """The request as a Generation; VllmError where the server does not run the config the cell states."""
        steps, where = reply.steps, self.url or "this vLLM"
        if self.config is None and steps is not None:
            raise VllmError(f"the server at {where} decodes speculatively (k = {steps.num_spec_tokens}): it cannot "
                            "record plain decoding")
        if self.config is not None and steps is None:
            raise VllmError(f"the server at {where} returns no per-step metrics: start it with its "
                            "--speculative-config and --per-request-spec-decode-metrics detailed")
        if steps is not None and steps.num_spec_tokens != k:
            raise VllmError(f"the server at {where} drafts k = {steps.num_spec_tokens}, not the cell's {k}")
        if steps is not None and (sum(steps.accepted), sum(steps.drafted)) != (
                steps.num_accepted_draft_tokens, steps.num_draft_tokens):
            raise VllmError("vLLM's per-step counts do not sum to its own totals")
        rounds = rounds_of(steps.drafted if steps else (), steps.accepted if steps else (), len(reply.output_ids))
        return Generation(prompt_tokens=tuple(ids), output_tokens=reply.output_ids, rounds=rounds,
                          prefill_s=reply.ttft_s, wall_s=reply.ttft_s + reply.generation_s,
                          draft_calls=len(steps.drafted) if steps else 0,
                          stop_reason="eos" if reply.finish_reason == "stop" else "max_new_tokens")

    def facts(self) -> dict[str, object]:
        """What a run record needs from the engine beside its generation."""
        return {"engine": self.name, "engine_version": self.version, "engine_config": json.dumps(self.config),
                "device": "cpu", "dtype": "float32", "threads": self.threads}

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
