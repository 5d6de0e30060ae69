"""vLLM as an engine: prompts chat-templated as ours are, each cell a request to vLLM running its speculative config
(here, runner/vllm/process.py, or a team's server over HTTP), each finished request a `Generation` whose rounds are
vLLM's verify steps.

`VllmEngine` meets the engine seam (runner/engines.py), so sweeps and `generate` run it as they run ours. It runs a
sweep's cells config by config (plain decoding first, so every speculative run finds its baseline), one vLLM engine
per config. A config vLLM refuses, a vLLM that does not start or dies: each cell it would have run becomes an error
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
from runner.vllm.process import Settings, VllmError, VllmProcess, reusable, vllm_python
from runner.vllm.steps import rounds_of

REQUEST_TIMEOUT_S = 600.0  # one request; past it the run is an error run and the sweep goes on
UNJUDGED = "unjudged"  # a vLLM output that differs from vLLM's plain one: vLLM returns no logits to classify it by


def engine_url(engine: str) -> str | None:
    """The server a team runs, from `--engine vllm:<url>`; None for `vllm` (run here)."""
    return engine.partition(":")[2] or None


def model_dir(spec: str) -> str:
    """What vLLM loads for a model spec: the directory specdash writes for a GGUF file (written first if missing),
    else the spec itself (a directory or a cached repo id)."""
    if spec != DEFAULT_MODEL and not spec.endswith(".gguf"):
        return str(Path(spec).expanduser()) if spec.startswith("~") else spec
    return str(dequantized(smollm2_gguf() if spec == DEFAULT_MODEL else Path(spec)))


class VllmEngine:
    """A target decoded by vLLM on the sweep's max_new_tokens and seed: here, an engine per speculative config (the
    previous one dropped), or by the server a team runs at `url`, whose config is the one the cells state.
    """

    name = "vllm"
    device, dtype, kernels = "cpu", "float32", None  # as vLLM runs the target here (process.Settings)

    def __init__(self, target: str, url: str | None, threads: int, max_new_tokens: int, seed: int) -> None:
        self.target, self.url, self.threads = target, url, threads
        self.max_new_tokens, self.seed = max_new_tokens, seed
        if url is None:
            vllm_python()  # no environment: one line naming what builds it, before any tokenizer is read
        self.model = model_dir(target)
        self.tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(self.model, local_files_only=True)
        self.vllm: VllmProcess | None = None
        self.running: dict | None = None  # the speculative config of the cells now running
        self.refused: dict[str, str] = {}  # a config's JSON -> why vLLM did not start with it
        served = client.get(url, "/v1/models")["data"][0] if url else {}
        # a team's server: the context it serves; ours: the target's own (SmolLM2's 8,192 positions)
        self.served = served.get("id")
        self.context = served.get("max_model_len") or AutoConfig.from_pretrained(
            self.model, local_files_only=True).max_position_embeddings
        self.longest = self.context  # what vLLM here serves: the longest sequence a cell may ask
        self.version = client.get(url, "/version").get("version") if url else None
        self.provenance = host_provenance()

    def prepare(self, workload: Workload) -> None:
        """Every prompt checked against the served context; vLLM here warms up as each config starts (`use`)."""
        lengths = [(p.id, len(self.prompt_ids(p))) for p in workload.prompts]
        check_fit(lengths, self.max_new_tokens, self.context)
        # No more than the sweep needs (its KV cache must hold one whole sequence to start), with room for a last
        # step's k drafts: vLLM drafts fewer where they would pass its max_model_len.
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
        """Plain decoding's cells first, then each config's, in the plan's order; prompt lookup's configs last, since
        vLLM's process here cannot make another engine after one of theirs (process.reusable)."""
        first = {key: n for n, key in enumerate(dict.fromkeys((c.draft.text, c.k) for c in cells))}

        def rank(cell: Cell) -> tuple[bool, bool, int]:
            try:
                config = json.loads(self.config(cell))
            except (OSError, ValueError):  # a head vLLM cannot be given: the cell's error when it runs (`use`)
                config = {}
            return config is not None, not reusable(config), first[cell.draft.text, cell.k]

        return sorted(cells, key=rank)

    def config(self, cell: Cell) -> str:
        """The speculative config the cell runs with, as JSON ('null': plain decoding)."""
        return json.dumps(speculative_config(cell.draft, cell.k, model_dir))

    def use(self, cell: Cell, warm_ids: list[int]) -> None:
        """Make the cell's speculative config the one requests run with: here, its engine made when it changed (in
        the same process unless it cannot be reused) and warmed up by decoding `warm_ids` once (its first requests
        pay one-off costs: the n-gram matcher's JIT, allocations), as our engine warms up before its timed runs. A
        config vLLM did not start with is not tried again."""
        key = self.config(cell)
        if key in self.refused:
            raise VllmError(self.refused[key])
        config = json.loads(key)
        if self.url or (self.vllm is not None and config == self.running):
            self.running = config
            return
        if self.vllm is not None and (self.vllm.exited() or not reusable(self.running)):
            self.close()
        self.running = config
        try:
            if self.vllm is None:
                self.vllm = VllmProcess(Settings(self.model, self.threads, max_model_len=self.longest))
            self.version = self.vllm.load(config)
            self.served = self.model
            self.vllm.generate([warm_ids], self.max_new_tokens, [{"temperature": 0.0}], REQUEST_TIMEOUT_S)
        except VllmError as exc:
            self.refused[key] = str(exc)
            self.close()
            raise

    def run(self, cell: Cell, ids: list[int]) -> Generation:
        """One request: the cell's prompt ids decoded under its config."""
        return self.run_batch([cell], [ids])[0]

    def run_batch(self, cells: list[Cell], ids_list: list[list[int]]) -> list[Generation]:
        """B requests at once, which vLLM schedules into the same steps."""
        self.use(cells[0], ids_list[0])
        samplings = [self.sampling(cell) for cell in cells]
        if self.url:
            with ThreadPoolExecutor(len(cells)) as pool:
                replies = list(pool.map(lambda ids, sampling: client.complete(
                    self.url, self.served, ids, self.max_new_tokens, sampling, REQUEST_TIMEOUT_S), ids_list, samplings))
        else:
            replies = [client.reply_of(answer) for answer in self.vllm.generate(
                ids_list, self.max_new_tokens, samplings, REQUEST_TIMEOUT_S)]
        return [self.generation(ids, reply, cell.k) for cell, ids, reply in zip(cells, ids_list, replies, strict=True)]

    def sampling(self, cell: Cell) -> dict:
        d = cell.decoding
        return {"temperature": 0.0, "top_p": 1.0} if d.greedy else {"temperature": d.temperature, "top_p": d.top_p,
                                                                    "seed": self.seed}

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
        if self.vllm is not None:
            self.vllm.stop()
            self.vllm = None
