"""vLLM as an engine: prompts chat-templated as ours are, each cell sent as a request to a vLLM server running its
speculative config, each finished request a `Generation` whose rounds are vLLM's verify steps.

`VllmEngine` meets the engine seam (runner/engines.py), so sweeps and `generate` run it as they run ours. It runs a
sweep's cells config by config (plain decoding first, so every speculative run finds its baseline), one server per
config. A config vLLM refuses, a server that does not start or dies: each cell it would have run becomes an error
run with the one-line reason, nothing recorded is lost, and `--resume` runs them again.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerBase

from runner.cells import Cell, check_fit
from runner.engine.weights.sources import DEFAULT_MODEL, dequantized, smollm2_gguf
from runner.engines import Workload, host_provenance
from runner.prompts import Prompt
from runner.records import Divergence, Generation, first_difference
from runner.vllm import client
from runner.vllm.drafts import VllmRefusal, speculative_config
from runner.vllm.server import Server, ServerSettings, VllmError, vllm_python
from runner.vllm.steps import rounds_of

REQUEST_TIMEOUT_S = 600.0  # one request; past it the run is an error run and the sweep goes on
UNJUDGED = "unjudged"  # a vLLM output that differs from vLLM's plain one: vLLM returns no logits to classify it by


def engine_url(engine: str) -> str | None:
    """The server a team runs, from `--engine vllm:<url>`; None for `vllm` (servers started here)."""
    return engine.partition(":")[2] or None


def model_dir(spec: str) -> str:
    """What vLLM loads for a model spec: the directory specdash writes for a GGUF file (written first if missing),
    else the spec itself (a directory or a cached repo id)."""
    if spec != DEFAULT_MODEL and not spec.endswith(".gguf"):
        return str(Path(spec).expanduser()) if spec.startswith("~") else spec
    return str(dequantized(smollm2_gguf() if spec == DEFAULT_MODEL else Path(spec)))


class VllmEngine:
    """A target decoded by vLLM on the sweep's max_new_tokens and seed: servers started here, one per speculative
    config (the previous one stopped), or the server a team runs at `url`, whose config is the one the cells state.
    """

    name = "vllm"
    device, dtype, kernels = "cpu", "float32", None  # as vLLM's CPU server runs the target (ServerSettings)

    def __init__(self, target: str, url: str | None, threads: int, max_new_tokens: int, seed: int) -> None:
        self.target, self.url, self.threads = target, url, threads
        self.max_new_tokens, self.seed = max_new_tokens, seed
        if url is None:
            vllm_python()  # no environment: one line naming what builds it, before any tokenizer is read
        self.model = model_dir(target)
        self.tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(self.model, local_files_only=True)
        self.server: Server | None = None
        self.running: dict | None = None  # the speculative config of the cells now running
        self.refused: dict[str, str] = {}  # a config's JSON -> why its server did not start
        served = client.get(url, "/v1/models")["data"][0] if url else {}
        # a team's server: the context it serves; ours: the target's own (SmolLM2's 8,192 positions)
        self.served = served.get("id")
        self.context = served.get("max_model_len") or AutoConfig.from_pretrained(
            self.model, local_files_only=True).max_position_embeddings
        self.longest = self.context  # what a server started here serves: the longest sequence a cell may ask
        self.version = client.get(url, "/version").get("version") if url else None
        self.provenance = host_provenance()

    def prepare(self, workload: Workload) -> None:
        """Every prompt checked against the server's context; a server warms up when it starts (`use`)."""
        lengths = [(p.id, len(self.prompt_ids(p))) for p in workload.prompts]
        check_fit(lengths, self.max_new_tokens, self.context)
        # No more than the sweep needs (its KV cache must hold one whole sequence to start), with room for a last
        # step's k drafts: vLLM drafts fewer where they would pass its --max-model-len.
        self.longest = min(self.context, max(n for _, n in lengths) + self.max_new_tokens + max(workload.ks, default=0))

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        """The ids our engine feeds for the prompt: its chat template applied, ready for the answer."""
        if prompt.history:
            raise VllmRefusal(f'prompt "{prompt.id}" is a later turn: vLLM runs single-turn prompts only')
        messages = [{"role": "user", "content": prompt.text}]
        if getattr(self.tokenizer, "chat_template", None):
            return list(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                           return_dict=True)["input_ids"])
        return list(self.tokenizer(prompt.text)["input_ids"])

    def schedule(self, cells: list[Cell]) -> list[Cell]:
        """Plain decoding's cells first, then each config's, in the plan's order within a config."""
        order = {key: n for n, key in enumerate(dict.fromkeys(
            [(c.draft.text, c.k) for c in cells if c.k is None] + [(c.draft.text, c.k) for c in cells]))}
        return sorted(cells, key=lambda c: order[c.draft.text, c.k])

    def config(self, cell: Cell) -> str:
        """The speculative config the cell runs with, as JSON ('null': plain decoding)."""
        return json.dumps(speculative_config(cell.draft, cell.k, model_dir))

    def use(self, cell: Cell, warm_ids: list[int]) -> None:
        """Make the cell's speculative config the one requests run with: a new server here when it changed, warmed
        up by decoding `warm_ids` once (its first requests pay one-off costs: the n-gram matcher's JIT, allocations),
        as our engine warms up before its timed runs. A config whose server did not start is not tried again."""
        key = self.config(cell)
        if key in self.refused:
            raise VllmError(self.refused[key])
        config = json.loads(key)
        if self.url or (self.server is not None and config == self.running):
            self.running = config
            return
        self.close()
        self.running = config
        try:
            self.server = Server(ServerSettings(self.model, self.threads, max_model_len=self.longest), config)
            self.server.wait()
            self.served = self.model
            self.version = client.get(self.server.url, "/version").get("version")
            client.complete(self.server.url, self.served, warm_ids, self.max_new_tokens, {"temperature": 0.0},
                            REQUEST_TIMEOUT_S)
        except VllmError as exc:
            self.refused[key] = str(exc)
            self.close()
            raise

    def run(self, cell: Cell, ids: list[int]) -> Generation:
        """One request: the cell's prompt ids decoded under its config."""
        self.use(cell, ids)
        return self.request(cell, ids)

    def run_batch(self, cells: list[Cell], ids_list: list[list[int]]) -> list[Generation]:
        """B requests sent at once, which vLLM schedules into the same steps."""
        self.use(cells[0], ids_list[0])
        with ThreadPoolExecutor(len(cells)) as pool:
            return list(pool.map(self.request, cells, ids_list))

    def request(self, cell: Cell, ids: list[int]) -> Generation:
        if self.server is not None and (why := self.server.died()):
            raise VllmError(why)
        url = self.url or self.server.url
        d = cell.decoding
        sampling = {"temperature": 0.0, "top_p": 1.0} if d.greedy else {"temperature": d.temperature,
                                                                         "top_p": d.top_p, "seed": self.seed}
        return self.generation(ids, client.complete(url, self.served, ids, self.max_new_tokens, sampling,
                                                    REQUEST_TIMEOUT_S), cell.k)

    def generation(self, ids: list[int], reply: client.Reply, k: int | None) -> Generation:
        """The request as a Generation; VllmError where the server does not run the config the cell states."""
        steps, where = reply.steps, self.url or "this vLLM"
        if self.running is None and steps is not None:
            raise VllmError(f"the server at {where} decodes speculatively (k = {steps.num_spec_tokens}): it cannot "
                            "record plain decoding")
        if self.running is not None and steps is None:
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
                          stop_reason="eos" if reply.finish_reason == "stop" else "max_new_tokens",
                          ttft_s=reply.ttft_s, report=None if reply.report is None else json.dumps(reply.report))

    def text(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode(list(tokens))

    def tree_nodes(self, cell: Cell) -> None:
        """None: vLLM drafts chains."""

    def classify(self, prompt: tuple[int, ...], baseline: tuple[int, ...],
                 ours: tuple[int, ...]) -> Divergence | None:
        """Where a greedy vLLM output first differs from vLLM's plain one, not classified (no logits come back)."""
        at = first_difference(baseline, ours)
        return None if at is None else Divergence(at=at, gap=None, tolerance=None, kind=UNJUDGED)

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
