"""The target's exact law of the two tokens after the prefill's, and a chi-square test of sampled counts against it:
what the sampling-exactness tests of a drafter share."""

from __future__ import annotations

import torch
from scipy.stats import chisquare

from runner.engine.round.decoding_rule import Decoding
from runner.engine.round.sampling import probabilities
from runner.engine.weights.models import Loaded


def two_token_law(target: Loaded, prompt: list[int], vocab: int, decoding: Decoding) -> torch.Tensor:
    """P(x2, x3) = Σ_x1 p1(x1) p2(x2 | x1) p3(x3 | x1, x2), flattened, by full forward passes of the target."""
    with torch.inference_mode():
        def law(texts: list[list[int]]) -> torch.Tensor:
            return probabilities(target.model(torch.tensor(texts)).logits[:, -1], decoding)
        p1 = law([prompt])[0]
        p2 = law([prompt + [x] for x in range(vocab)])
        p3 = law([prompt + [x, y] for x in range(vocab) for y in range(vocab)]).view(vocab, vocab, vocab)
    return (p1[:, None, None] * p2[:, :, None] * p3).sum(0).view(-1)


def pooled_chisquare(observed: torch.Tensor, law: torch.Tensor, n: int) -> tuple[float, int]:
    """The p-value of `observed` counts (n draws) against `law`, outcomes expected fewer than 5 times pooled into
    one (chi-square needs 5 or more), and how many outcomes were tested on their own."""
    big = law * n >= 5
    expected = torch.cat([law[big], law[~big].sum().view(1)]) * n
    got = torch.cat([observed[big], observed[~big].sum().view(1)])
    keep = expected > 0
    want, seen = expected[keep].double().numpy(), got[keep].double().numpy()
    return chisquare(seen, want / want.sum() * seen.sum()).pvalue, int(big.sum())


def samples_p_value(samples: list[int], expected: torch.Tensor) -> float:
    """The chi-square p-value of drawn token ids against the (unnormalised) law `expected` over the same ids."""
    counts = torch.bincount(torch.tensor(samples), minlength=expected.numel()).double().numpy()
    want = expected.double().numpy()
    return chisquare(counts, want / want.sum() * counts.sum()).pvalue
