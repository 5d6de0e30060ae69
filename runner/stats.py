"""The explainer's numbers for one run: α, τ, c, and the speedups, measured and predicted."""

from __future__ import annotations

from dataclasses import dataclass

from runner.records import Generation


def theoretical_speedup(alpha: float, k: int, c: float) -> float:
    """Leviathan et al.: expected tokens per round (1 − α^(k+1)) / (1 − α) over its cost 1 + k·c."""
    tokens_per_round = k + 1 if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
    return tokens_per_round / (1 + k * c)


def best_k(alpha: float, c: float, k_max: int = 16) -> int:
    """The k the formula favours for this α and c."""
    return max(range(1, k_max + 1), key=lambda k: theoretical_speedup(alpha, k, c))


@dataclass(frozen=True)
class Summary:
    """One speculative run set against its plain-decoding baseline."""

    rounds: int
    accepted: int
    rejected: int
    thrown: int
    alpha: float | None  # accepted / (accepted + rejected); thrown drafts were never judged
    tau: float | None  # tokens emitted per round
    c: float | None  # one drafted token's time / one one-token target pass (of the baseline)
    measured_speedup: float  # baseline s/token ÷ speculative s/token
    predicted_speedup: float | None  # the formula at this run's α, k and c
    lossless: bool | None  # greedy: output equals the baseline's token for token


def summarize(run: Generation, baseline: Generation, k: int, greedy: bool) -> Summary:
    accepted = sum(r.accepted for r in run.rounds)
    rejected = sum(r.rejected for r in run.rounds)
    drafted = sum(r.k for r in run.rounds)
    alpha = accepted / (accepted + rejected) if accepted + rejected else None
    # No rounds at all when the prefill's token already ends the run (EOS, or max-new-tokens 1).
    target_pass_s = baseline.verify_s / len(baseline.rounds) if baseline.rounds else None
    c = run.draft_s / drafted / target_pass_s if drafted and target_pass_s else None
    return Summary(
        rounds=len(run.rounds), accepted=accepted, rejected=rejected, thrown=drafted - accepted - rejected,
        alpha=alpha, tau=sum(r.emitted for r in run.rounds) / len(run.rounds) if run.rounds else None, c=c,
        measured_speedup=(baseline.wall_s / len(baseline.output_tokens)) / (run.wall_s / len(run.output_tokens)),
        predicted_speedup=theoretical_speedup(alpha, k, c) if alpha is not None and c is not None else None,
        lossless=run.output_tokens == baseline.output_tokens if greedy else None,
    )
