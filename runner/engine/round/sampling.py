"""The maths of one decision: greedy choice, temperature and top-p, and speculative sampling.

Notation follows the papers (Leviathan et al. 2022; Chen et al. 2023): p is the TARGET's
distribution, q the DRAFT's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from runner.engine.round.decoding_rule import Decoding


def host(values: Tensor) -> list:
    """The one way the decode loop reads device values on the host. On CUDA every call waits for the device to
    finish its queue, so a round makes as few as it can (tests count the calls)."""
    return values.tolist()


def probabilities(logits: Tensor, decoding: Decoding) -> Tensor:
    """(..., V) logits -> (..., V) probabilities after temperature, then top-p, renormalised.

    A row that is not finite (a float16 overflow) becomes uniform: drawing from NaN would trip a device-side
    assert on CUDA and kill the process's context, while the decode loop reports the target's bad logits itself.
    """
    probs = torch.softmax(logits.float() / decoding.temperature, dim=-1)
    probs = torch.where(probs.isfinite().all(-1, keepdim=True), probs, 1.0 / probs.shape[-1])
    if decoding.top_p < 1:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # A token stays if the mass strictly before it is below top_p: the smallest set reaching top_p.
        drop = (sorted_probs.cumsum(-1) - sorted_probs) >= decoding.top_p
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs.masked_fill(drop, 0.0))
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def draw(probs: Tensor, generator: torch.Generator) -> Tensor:
    """One token id from a (V,) distribution, as a (1,) tensor."""
    return torch.multinomial(probs, 1, generator=generator)


def residual(p: Tensor, q: Tensor) -> Tensor:
    """Where to draw the correction after a rejection: norm(max(0, p - q)), computed on the device.

    A deterministic draft (prompt lookup) is a point mass (one-hot q), so the residual is p without that token.
    """
    left = (p - q).clamp_min(0.0)
    total = left.sum()
    # p == q up to rounding can leave nothing; rejection is then (almost) impossible, so p is exact enough.
    return torch.where(total > 0, left / total, p)


def accept_greedy(drafts: list[int], choices: list[int]) -> int:
    """How many drafts equal the target's argmax, counting from the left."""
    n = 0
    while n < len(drafts) and drafts[n] == choices[n]:
        n += 1
    return n


def accept_sampled(drafts: Tensor, q: Tensor | None, p: Tensor,
                   generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """Speculative sampling over one round: (accepted count, the correction or bonus token, the test) as tensors on
    p's device, so the round reads them with its one host sync.

    drafts: (k,) ids; q: (k, V) draft probabilities or None (a deterministic draft); p: (k+1, V).
    Each d_i is accepted with probability min(1, p_i(d_i) / q_i(d_i)); the first failure is replaced
    by a draw from norm(max(0, p_i - q_i)); if all pass, the bonus is drawn from p_{k+1}.
    The test, (3k + 1,) float64: p_i(d_i), q_i(d_i) and the uniform draw u_i of every draft (d_i accepted iff
    u_i < p_i(d_i) / q_i(d_i); only the first accepted + 1 were judged), then 1 when the token was drawn from a
    non-empty residual, else 0.
    """
    k, vocab = drafts.numel(), p.shape[-1]
    q = torch.nn.functional.one_hot(drafts, vocab).to(p.dtype) if q is None else q.to(p.dtype)
    rows = torch.arange(k, device=p.device)
    r = torch.rand(k, generator=generator, device=p.device)
    p_d, q_d = p[rows, drafts], q[rows, drafts]  # (k,) each
    n = (r * q_d < p_d).int().cumprod(0).sum()  # r < p/q without dividing by a tiny q
    # Row k+1 of q is zero, so after k acceptances the residual is p_{k+1} itself: the bonus.
    q_next = torch.cat([q, q.new_zeros(1, vocab)]).index_select(0, n.view(1))[0]
    p_next = p.index_select(0, n.view(1))[0]
    from_residual = (n < k) & ((p_next - q_next).clamp_min(0.0).sum() > 0)
    test = torch.cat([p_d.double(), q_d.double(), r.double(), from_residual.double().view(1)])
    return n, draw(residual(p_next, q_next), generator)[0], test


@dataclass(frozen=True)
class Ranked:
    """The target's likeliest tokens at each of T rows, best first, and the rows' logits they were read from."""

    tokens: Tensor  # (T, w) ids
    logits: Tensor  # (T, V)

    @property
    def probs(self) -> Tensor:
        """(T, w) the tokens' probabilities (temperature 1): a pass over the vocabulary, made only when read."""
        lse = self.logits.float().logsumexp(-1, keepdim=True)
        return (self.logits.gather(-1, self.tokens).float() - lse).exp()


def ranked(logits: Tensor, width: int) -> Ranked:
    """The `width` likeliest tokens of each row of `logits` (T, V)."""
    return Ranked(logits.topk(width, dim=-1).indices, logits)
