"""Our engine behind the seam (runner/engines.py): a target paired with its drafts (runner/engine/pair.py), each
prompt's ids encoded once, and the facts a run's record reads."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

import torch
import transformers

from runner.cells import Cell, check_fit
from runner.engine.drafters.spec import PLAIN, DraftSpec
from runner.engine.pair import Pair
from runner.engine.round import lossless
from runner.engine.round.decoding_rule import Decoding
from runner.engine.weights import kernels, models
from runner.engines import Workload, host_provenance
from runner.prompts import Prompt
from runner.records import Divergence, Generation

GREEDY = Decoding("greedy", 0.0, 1.0)  # how a later turn's earlier answers are written


class PromptIds:
    """Each prompt's token ids on a loaded target, encoded once: a later turn's after the earlier turns and the
    target's answers to them, through the chat template."""

    def __init__(self, pair: Pair, max_new_tokens: int, seed: int) -> None:
        self.pair, self.max_new_tokens, self.seed = pair, max_new_tokens, seed
        self.ids: dict[str, list[int]] = {}  # prompt id -> its ids
        self.answers: dict[tuple[str, int], str] = {}  # (conversation, turn) -> the target's answer to that turn

    def __call__(self, prompt: Prompt) -> list[int]:
        if prompt.id not in self.ids:
            history = tuple((text, self.answer(prompt.thread, turn, prompt.history[:turn])) for turn, text
                            in enumerate(prompt.history, 1))
            self.ids[prompt.id] = models.encode_chat(self.pair.target, prompt.text, history)
        return self.ids[prompt.id]

    def answer(self, conversation: str, turn: int, asked: tuple[str, ...]) -> str:
        """The target's plain greedy answer to turn `turn` of a conversation whose user messages so far are `asked`:
        what a later turn is asked after. Greedy, so it is every lossless greedy run's own answer, and every run of
        a later turn (baseline, each draft and k, either mode) is fed the same ids and checked against one baseline.
        """
        if (conversation, turn) not in self.answers:
            earlier = tuple((text, self.answer(conversation, n, asked[:n])) for n, text in enumerate(asked[:-1], 1))
            ids = models.encode_chat(self.pair.target, asked[-1], earlier)
            generation = self.pair.run(PLAIN, ids, None, GREEDY, self.max_new_tokens, self.seed)
            self.answers[conversation, turn] = models.answer_text(self.pair.target, generation.output_tokens)
        return self.answers[conversation, turn]


def provenance(device: torch.device) -> dict[str, str]:
    """What made a run, beside its numbers: versions, host, the project's commit, the device's name."""
    return host_provenance() | {
        "torch_version": torch.__version__, "transformers_version": transformers.__version__,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else kernels.cpu_name(),
    }


class PairEngine:
    """The `Engine` that decodes with a `Pair` in this process: on the sweep's target, seed and max_new_tokens."""

    name = "specdash"
    version = None  # the project's commit is in the provenance

    def __init__(self, pair: Pair, max_new_tokens: int, seed: int) -> None:
        self.pair, self.max_new_tokens, self.seed = pair, max_new_tokens, seed
        self.prompt_ids = PromptIds(pair, max_new_tokens, seed)
        target = pair.target
        self.device, self.dtype, self.kernels = str(target.device), lossless.dtype_name(target.dtype), pair.kernels

    @classmethod
    def load(cls, target: str, drafts: Sequence[DraftSpec], kernels_name: str, max_new_tokens: int, seed: int,
             device: str | None = None, dtype: str | None = None, trust_remote_code: bool = False) -> PairEngine:
        """The target and every draft loaded (`models.load`, then the pair)."""
        loaded = models.load(target, device, dtype, trust_remote_code)
        return cls(Pair(loaded, list(drafts), kernels_name), max_new_tokens, seed)

    def prepare(self, workload: Workload) -> None:
        """Every prompt checked against the context, then a warm-up per decoding on the first prompt."""
        check_fit([(p.id, len(self.prompt_ids(p))) for p in workload.prompts], self.max_new_tokens,
                  self.pair.target.max_context)
        for decoding in workload.decodings:
            self.pair.warm_up([PLAIN, *workload.drafts], self.prompt_ids(workload.prompts[0]), workload.ks, decoding,
                              self.max_new_tokens, workload.batches)

    def schedule(self, cells: list[Cell]) -> list[Cell]:
        """As planned: a run's baseline is its neighbour in time, and a sweep cut short covers every category."""
        return cells

    @property
    def threads(self) -> int:
        return torch.get_num_threads()

    @cached_property
    def provenance(self) -> dict[str, str]:
        return provenance(self.pair.target.device)

    def run(self, cell: Cell, ids: list[int]) -> Generation:
        return self.pair.run(cell.draft, ids, cell.k, cell.decoding, self.max_new_tokens, self.seed, cell.policy)

    def run_batch(self, cells: list[Cell], ids_list: list[list[int]]) -> list[Generation]:
        first = cells[0]
        return self.pair.run_batch(first.draft, ids_list, first.k, first.decoding, self.max_new_tokens, self.seed,
                                   first.policy)

    def text(self, tokens: Sequence[int]) -> str:
        return self.pair.target.tokenizer.decode(list(tokens))

    def tree_nodes(self, cell: Cell) -> int | None:
        return self.pair.nodes_for(cell.draft, cell.k, cell.batch_size)

    def config(self, cell: Cell) -> str | None:
        """None: the cell's own columns (draft, k, policy, kernels) state what ran."""
        return None

    def classify(self, prompt: tuple[int, ...], baseline: tuple[int, ...], ours: tuple[int, ...]) -> Divergence | None:
        """Where and why a greedy output differs from its baseline's (a target pass: `lossless.classify`)."""
        return lossless.classify(self.pair.target, prompt, baseline, ours)

    def close(self) -> None:
        """Nothing to stop: the models go with the process."""
