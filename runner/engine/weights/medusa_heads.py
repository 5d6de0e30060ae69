"""Medusa-1 heads as modules (Cai et al. 2024): `heads` heads of residual blocks (x + SiLU(W x + b)) and an LM head
each, its own or the target's, all reading the target's final normed hidden state (runner/engine/drafters/medusa.py
drafts with them)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

FINAL_NORMED = -1  # `wants_hidden`: transformers' last hidden state, after the final norm


class ResBlock(nn.Module):
    """x + SiLU(linear(x)): a Medusa head's block, zero-initialisable to the identity."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)

    def forward(self, x: Tensor) -> Tensor:
        return x + F.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """`heads` heads of `layers` blocks each; head i's LM head is `lm_heads[i]`, or the target's where it has none.

    The parameter names are the published ones: `{i}.{j}.linear.weight`, `{i}.{layers}.weight` (`weights()`).
    """

    def __init__(self, heads: int, layers: int, hidden: int, own_lm_heads: tuple[bool, ...], target_lm: Tensor,
                 vocab: int) -> None:
        super().__init__()
        self.layers = layers
        self.blocks = nn.ModuleList(nn.Sequential(*(ResBlock(hidden) for _ in range(layers))) for _ in range(heads))
        rows = target_lm.shape[0]
        self.lm_heads = nn.ModuleList(nn.Linear(hidden, rows, bias=False) if own else nn.Identity()
                                      for own in own_lm_heads)
        self.target_lm = target_lm.detach()  # (V, H) the target's LM head weight, shared, not a parameter here
        self.vocab = vocab  # logits past the tokenizer's ids are cut, as the target's are

    @property
    def heads(self) -> int:
        return len(self.blocks)

    def forward(self, hidden: Tensor) -> Tensor:
        """(heads, vocab) logits from one (H,) hidden state, or (heads, N, vocab) from (N, H)."""
        out = []
        for blocks, lm in zip(self.blocks, self.lm_heads, strict=True):
            x = blocks(hidden)
            out.append(F.linear(x, self.target_lm) if isinstance(lm, nn.Identity) else lm(x))
        return torch.stack(out)[..., : self.vocab]

    def weights(self) -> dict[str, Tensor]:
        """The tensors under their published names (no `medusa_head.` prefix; the target's LM head left out)."""
        named = {}
        for i, (blocks, lm) in enumerate(zip(self.blocks, self.lm_heads, strict=True)):
            for j, block in enumerate(blocks):
                named[f"{i}.{j}.linear.weight"], named[f"{i}.{j}.linear.bias"] = block.linear.weight, block.linear.bias
            if not isinstance(lm, nn.Identity):
                named[f"{i}.{self.layers}.weight"] = lm.weight
        return named

    def load_weights(self, tensors: dict[str, Tensor]) -> None:
        """Copy tensors named as `weights()` names them; every one must be there."""
        mine = self.weights()
        assert set(tensors) == set(mine), sorted(set(tensors) ^ set(mine))
        with torch.no_grad():
            for name, t in tensors.items():
                mine[name].copy_(t)
