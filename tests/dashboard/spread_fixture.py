"""A hand-made runs.duckdb for the pooling and tie rule (`runner/store/spread.py`), every number chosen so that its
spread is known by hand.

Every output is 12 tokens, every baseline takes 1.2 s, so a run of `w` seconds has speedup 1.2 / w exactly. Two
chain schedules at k = 2: FULL accepts every draft (4 rounds, 8 accepted, 0 rejected: α 1) and HALF accepts one of
two (6 rounds, 6 accepted, 5 rejected: α 6/11; its last round, one draft short of the budget, accepts it).

code (prompts c1, c2, c3), greedy, skinny kernels, 1 thread:
- prompt lookup `ngram` k=2: 4×, 4×, 4×, but c1 twice, at 2× and 8× (its repeats pool to 4×): 4×, interval [4, 4]
  (pooled over runs instead, the spread would not be 0); α 1;
- `ngram` k=3: 1.6× on every prompt, interval [1.6, 1.6]; α 8/11 (the last round drafts 2 of 3 and accepts them);
- layer skip `layerskip:2` k=2: 2× on every prompt, interval [2, 2]: the runner-up, below the winner's interval, so
  no tie; α (6 + 8 + 6) / (20 + 10) = 2/3, its prompts 6/11 to 1.
poem (prompts p1, p2):
- `ngram` k=2: 2× and 8× (4×; ln sd √2 · ln 2, t(0.975, 1) = 12.706): its interval reaches far below 3;
- `layerskip:2` k=2: 3× and 3×: 3×, interval [3, 3], inside the winner's: a tie.
"""

from __future__ import annotations

from pathlib import Path

from runner.records import Generation, Round, RunRecord
from runner.store.runs import write_run

BASE_S = 1.2
FULL, HALF = [2, 2, 2, 2], [1, 1, 1, 1, 1, 1]
# (category, prompt, draft, k, repeat, speedup, schedule)
RUNS = [
    ("code", "c1", "ngram", 2, 0, 2.0, FULL), ("code", "c1", "ngram", 2, 1, 8.0, FULL),
    ("code", "c2", "ngram", 2, 0, 4.0, FULL), ("code", "c3", "ngram", 2, 0, 4.0, FULL),
    *(("code", p, "ngram", 3, 0, 1.6, FULL) for p in ("c1", "c2", "c3")),
    ("code", "c1", "layerskip:2", 2, 0, 2.0, HALF), ("code", "c2", "layerskip:2", 2, 0, 2.0, FULL),
    ("code", "c3", "layerskip:2", 2, 0, 2.0, HALF),
    ("poem", "p1", "ngram", 2, 0, 2.0, FULL), ("poem", "p2", "ngram", 2, 0, 8.0, HALF),
    ("poem", "p1", "layerskip:2", 2, 0, 3.0, HALF), ("poem", "p2", "layerskip:2", 2, 0, 3.0, HALF),
]
CATEGORIES = {"c1": "code", "c2": "code", "c3": "code", "p1": "poem", "p2": "poem"}


def _rounds(k: int | None, schedule: list[int]) -> list[Round]:
    """Chain rounds over the 12-token truth 100..111, as runner.decode makes them (k shrinks at the budget)."""
    truth, rounds, at = list(range(100, 112)), [], 0
    for accepted in schedule:
        k_round = 0 if k is None else min(k, len(truth) - at - 1)
        rejected = int(accepted < k_round)
        drafts = truth[at:at + accepted] + [900] * (k_round - accepted)
        target = truth[at:at + accepted + 1] + [800] * (k_round - accepted)
        rounds.append(Round(k_round, accepted, rejected, k_round - accepted - rejected, accepted == k_round,
                            accepted + 1, 0.001 * k_round, 0.05, tuple(drafts), tuple(target)))
        at += accepted + 1
    assert at == 12
    return rounds


def _run(run_id: str, prompt: str, draft: str, k: int | None, repeat: int, wall_s: float, rounds: list[Round],
         minute: int) -> RunRecord:
    output = tuple(range(100, 112))
    gen = Generation((1, 2, 3), output, tuple(rounds), 0.01, wall_s, sum(r.k > 0 for r in rounds), "max_new_tokens")
    kind = "baseline" if draft == "none" else draft.split(":")[0]
    baseline = None if k is None else f"{prompt}-base-{repeat}"
    return RunRecord(run_id, "s-spread", f"2026-02-01T10:{minute:02d}:00", "tiny", draft, kind, CATEGORIES[prompt],
                     prompt, "x", k, "greedy", 0.0, 1.0, 0, 12, "cpu", "float32", "ok", None, gen, "x", baseline,
                     None if k is None else True, kernels="skinny", threads=1,
                     k_policy=None if k is None else "fixed", repeat=repeat)


def build(db: Path) -> Path:
    """Each prompt's baseline of each repeat, then the runs of RUNS, each against its repeat's baseline."""
    minute = 0
    for prompt, repeat in sorted({(p, r) for _, p, _, _, r, _, _ in RUNS}):
        write_run(db, _run(f"{prompt}-base-{repeat}", prompt, "none", None, repeat, BASE_S, _rounds(None, [0] * 12),
                           minute))
        minute += 1
    for _, prompt, draft, k, repeat, speedup, schedule in RUNS:
        write_run(db, _run(f"{prompt}-{draft}-k{k}-r{repeat}", prompt, draft, k, repeat, BASE_S / speedup,
                           _rounds(k, schedule), minute))
        minute += 1
    return db
