"""How each token is chosen (greedy or sampled, with temperature and top-p): a value the command line parses and a
cell carries, without torch."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Decoding:
    """How each token is chosen; the same rule is applied to p and q."""

    mode: str  # 'greedy' (argmax, lossless check applies) or 'sample'
    temperature: float = 1.0  # sample mode: logits are divided by it before the softmax
    top_p: float = 1.0  # sample mode: keep the smallest set of tokens whose mass reaches top_p

    def __post_init__(self) -> None:
        if self.mode not in ("greedy", "sample"):
            raise ValueError(f'unknown mode "{self.mode}"; use greedy or sample')
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.mode == "sample" and self.temperature == 0:
            raise ValueError("temperature 0 means greedy: use --mode greedy")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top-p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.mode == "greedy"
