"""A hand-built runs.duckdb for the dashboard tests, with round outcomes chosen so every number is known.

Every prompt's plain greedy output is 12 tokens (max_new_tokens = 12). A speculative run is given as
one accepted count per round; the rounds are then built the way runner.decode does: k shrinks to
budget − 1 near the end, the first failing draft is rejected, the rest are thrown, and the target adds
a correction, a bonus, or (k = 0) a plain token. `None` is a round where the drafter found nothing.

Timing: a one-token pass takes 0.05 s and a pass over k drafts 0.05·(1 + 0.1·k) s; a drafted token
costs 0.0025 s (ngram, c = 0.05) or 0.02 s (layerskip:2, c = 0.4). Baselines take 1.2 s for 12 tokens
(0.1 s/token) except code-02's, which takes 2.4 s; measured speedup = baseline s/token ÷ run s/token.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import duckdb

from runner.records import Generation, Round, RunRecord
from runner.store import run_facts
from runner.store.bench_rows import BENCH_COLUMNS, write_bench
from runner.store.round_counts import FILL_ROUND_COUNTS
from runner.store.runs import write_run

SWEEP = "s1"
TARGET = "tiny-target"  # not a loadable model: the replay falls back to token ids
PROMPTS = {"code-01": ("code", list(range(100, 112))), "code-02": ("code", list(range(200, 212))),
           "poem-01": ("poem", list(range(300, 312)))}
ONE_PASS_S = 0.05
DRAFT_TOKEN_S = {"ngram": 0.0025, "layerskip:2": 0.02, "ngram-tree": 0.0025}

# (run_id, prompt_id, draft, k, accepted per round, wall_s, lossless)
SPECULATIVE = [
    ("c1-ng-k2", "code-01", "ngram", 2, [2, 1, 2, 2, 0], 0.6, True),
    ("c1-ng-k4", "code-01", "ngram", 4, [4, 2, 3], 0.5, True),
    ("c2-ng-k2", "code-02", "ngram", 2, [2, 2, 2, 2], 0.6, True),
    ("c1-ls-k2", "code-01", "layerskip:2", 2, [1, 0, 1, 0, 1, 0, 1, 0], 1.5, True),
    ("c1-ls-k4", "code-01", "layerskip:2", 4, [2, 0, 1, 0, 3, 0], 2.0, True),
    ("p1-ng-k2", "poem-01", "ngram", 2, [None, 1, 0, 0, 0, None, 0, 0, 0, 0, 0], 1.0, True),
    ("p1-ng-k4", "poem-01", "ngram", 4, [0] * 12, 1.6, True),
    ("p1-ls-k2", "poem-01", "layerskip:2", 2, [1, 0, 2, 0, 1, 0, 0, 0], 2.4, True),
    ("p1-ls-k4", "poem-01", "layerskip:2", 4, [3, 0, 4, 1], 1.2, False),
]
BASELINE_WALL_S = {"code-01": 1.2, "code-02": 2.4, "poem-01": 1.2}
# The lossy run's own greedy text differs from its baseline's at token 6.
LOSSY_TRUTH = [*range(300, 306), 399, *range(307, 312)]


def _round(truth: list[int], at: int, k: int, accepted: int, draft_token_s: float) -> Round:
    """One round that starts at output position `at` with k drafts, `accepted` of them agreed."""
    rejected = int(accepted < k)
    drafts = truth[at:at + accepted] + [900 + at] * rejected + [950 + at + i for i in range(k - accepted - rejected)]
    # Greedy: the target's token at all k+1 positions; after a wrong draft it says something else (800+).
    target = truth[at:at + accepted + 1] + [800 + at + i for i in range(k - accepted)]
    return Round(k, accepted, rejected, k - accepted - rejected, accepted == k, accepted + 1, k * draft_token_s,
                 ONE_PASS_S * (1 + 0.1 * k), tuple(drafts), tuple(target))


def speculative_rounds(truth: list[int], k: int, schedule: list[int | None], draft_token_s: float) -> list[Round]:
    rounds, at = [], 0
    for accepted in schedule:
        k_round = 0 if accepted is None else min(k, len(truth) - at - 1)
        rounds.append(_round(truth, at, k_round, accepted or 0, draft_token_s))
        at += rounds[-1].emitted
    assert at == len(truth), f"the schedule emits {at} tokens, not {len(truth)}"
    return rounds


def _kept(r: Round) -> tuple[int, ...]:
    """What a round appends: the accepted drafts (a tree: its path's nodes), then the target's own token."""
    if r.draft_parents is None:
        return r.draft_tokens[:r.accepted] + r.target_tokens[r.accepted:][:1]
    after = r.accepted_path[-1] + 1 if r.accepted_path else 0  # greedy: the target's token at the root, then per node
    return tuple(r.draft_tokens[node] for node in r.accepted_path) + (r.target_tokens[after],)


def _record(run_id: str, prompt_id: str, draft: str, k: int | None, rounds: list[Round], wall_s: float,
            baseline: str | None, lossless: bool | None, target: str, minute: int) -> RunRecord:
    category, _ = PROMPTS[prompt_id]
    output = tuple(t for r in rounds for t in _kept(r))
    gen = Generation((1, 2, 3), output, tuple(rounds), 0.1, wall_s, sum(r.k > 0 for r in rounds), "max_new_tokens")
    kind = "baseline" if draft == "none" else draft.split(":")[0]
    return RunRecord(run_id, SWEEP, f"2026-01-01T12:{minute:02d}:00", target, draft, kind, category, prompt_id,
                     f"write some {category}", k, "greedy", 0.0, 1.0, 0, 12, "cpu", "float32", "ok", None, gen,
                     " ".join(map(str, output)), baseline, lossless, kernels="skinny", threads=2,
                     k_policy=None if k is None else "fixed")


def speculative_record(run_id: str, prompt_id: str, draft: str, k: int, schedule: list[int | None], wall_s: float,
                       lossless: bool = True, target: str = TARGET, minute: int = 30) -> RunRecord:
    """A greedy speculative run of `prompt_id` against its baseline, from accepted counts per round."""
    truth = PROMPTS[prompt_id][1] if lossless else LOSSY_TRUTH
    rounds = speculative_rounds(truth, k, schedule, DRAFT_TOKEN_S[draft])
    return _record(run_id, prompt_id, draft, k, rounds, wall_s, f"{prompt_id}-base", lossless, target, minute)


def baseline_record(prompt_id: str, target: str = TARGET, minute: int = 0) -> RunRecord:
    """The plain greedy run `<prompt_id>-base`: 12 one-token rounds in BASELINE_WALL_S[prompt_id]."""
    rounds = speculative_rounds(PROMPTS[prompt_id][1], 0, [0] * 12, 0.0)
    return _record(f"{prompt_id}-base", prompt_id, "none", None, rounds, BASELINE_WALL_S[prompt_id], None, None,
                   target, minute)


def build(db: Path, target: str = TARGET) -> Path:
    """Write the fixture database at `db` (new file) and return its path."""
    minute = 0
    for prompt_id in PROMPTS:
        write_run(db, baseline_record(prompt_id, target, minute))
        minute += 1
    for run_id, prompt_id, draft, k, schedule, wall_s, lossless in SPECULATIVE:
        write_run(db, speculative_record(run_id, prompt_id, draft, k, schedule, wall_s, lossless, target,
                                               minute))
        minute += 1
    failed = RunRecord("c1-ls-k8", SWEEP, "2026-01-01T12:59:00", target, "layerskip:2", "layerskip", "code",
                       "code-01", "write some code", 8, "greedy", 0.0, 1.0, 0, 12, "cpu", "float32", "error",
                       "out of memory", None, None, None, None)
    write_run(db, failed)
    return db


def _tree_round(parents: tuple[int, ...], drafts: tuple[int, ...], path: tuple[int, ...], rejected: int,
                target: tuple[int, ...]) -> Round:
    k, accepted = len(drafts), len(path)
    return Round(k, accepted, rejected, k - accepted - rejected, not rejected, accepted + 1,
                 k * DRAFT_TOKEN_S["ngram-tree"], ONE_PASS_S * (1 + 0.1 * k), drafts, target, parents, path)


# code-02 (truth 200..211) drafted as trees at depth 3. Wrong tokens are 900+, the target's other choices 800+.
TREE_ROUNDS = [
    # 200 → 201 → 902, and 950 beside 200: the path 200, 201; 902, 201's only child, refused; 950 thrown; 202 added
    _tree_round((-1, 0, 1, -1), (200, 201, 902, 950), (0, 1), 1, (200, 201, 202, 803, 851)),
    # 903 and 203 at the root, 203 → 204 → 205: the path ends at the leaf 205, so 206 comes free; 903 thrown
    _tree_round((-1, -1, 1, 2), (903, 203, 204, 205), (1, 2, 3), 0, (203, 804, 204, 205, 206)),
    # 907 at the root with two children: 907 refused, its children thrown; the correction 207
    _tree_round((-1, 0, 0), (907, 208, 209), (), 1, (207, 808, 809, 810)),
    # no match: a plain token
    Round(0, 0, 0, 0, False, 1, 0.0, ONE_PASS_S, (), (208,)),
    # two tokens left to draft, as one chain: recorded as a chain (draft_parents NULL), bonus 211
    Round(2, 2, 0, 0, True, 3, 2 * DRAFT_TOKEN_S["ngram-tree"], ONE_PASS_S * 1.2, (209, 210), (209, 210, 211)),
]


def add_trees(db: Path) -> Path:
    """One greedy `ngram-tree` run at depth 3 (`c2-tree-k3`) on code-02, of TREE_ROUNDS, in 0.8 s."""
    write_run(db, _record("c2-tree-k3", "code-02", "ngram-tree", 3, TREE_ROUNDS, 0.8, "code-02-base", True, TARGET,
                          58))
    return db


def retimed(path: Path) -> Path:
    """The fixture with its tree run, its verify times re-timed in 1/64 s (so that every sum of them is exact
    whatever order it is added in), and the per-run tables worked out again from those rounds."""
    add_trees(build(path))
    with duckdb.connect(str(path)) as con:
        con.execute("UPDATE rounds SET verify_s = (1 + k + round % 3) / 64")
        con.execute("UPDATE runs r SET verify_s = (SELECT sum(verify_s) FROM rounds d WHERE d.run_id = r.run_id)")
        con.execute("DELETE FROM round_counts")
        con.execute(FILL_ROUND_COUNTS)
        run_facts.refresh_all(con)
    return path


def bench_row(bench_id: str, started: str, metric: str, draft: str, k: int, ours: float, theirs: float | None,
              ratio: float | None, goal: str | None = None, met: bool | None = None, k_policy: str = "fixed") -> dict:
    """One `bench_results` row; each value's min and max lie 10% around it."""
    row = dict.fromkeys(BENCH_COLUMNS)
    for name, value in {"ours": ours, "theirs": theirs, "ratio": ratio}.items():
        row |= {name: value, f"{name}_min": value and value * 0.9, f"{name}_max": value and value * 1.1}
    unit = {"plain_tokens_per_s": "tokens/s", "spec_tokens_per_s": "tokens/s", "adaptive_tokens_per_s": "tokens/s",
            "verify_ms": "ms",
            "verify_ms_stock": "ms"}[metric]
    return row | {"bench_id": bench_id, "started_at": datetime.fromisoformat(started), "device": "cpu",
                  "device_name": "a test CPU", "dtype": "float32", "threads": 1, "target": TARGET,
                  "draft": draft, "k": k, "k_policy": k_policy, "category": "all", "metric": metric, "unit": unit,
                  "repeats": 3,
                  "prompts": 3, "max_new_tokens": 32, "mismatches": 0, "goal": goal, "goal_met": met,
                  "load_before": 0.5, "load_after": 1.5, "command": "python bench/bench.py", "torch_version": "2",
                  "transformers_version": "5", "host": "h", "git_commit": ""}


def add_benches(db: Path) -> Path:
    """Two benches: b-old (one goal, met) and the newer b-new (goals 1 of 2 met; one row of prompt lookup's
    heuristic policy; chain verify curves 1, 1.6, 2 on the skinny kernels and 1, 2, 3 on stock, recorded as a
    bench before trees did (draft 'none'); a tree of 5 rows at 1.5 on the skinny kernels)."""
    write_bench(db, [bench_row("b-old", "2026-01-01", "plain_tokens_per_s", "none", 0, 10, 10, 1.0,
                                     "ratio >= 1", True)])
    write_bench(db, [
        bench_row("b-new", "2026-02-01", "plain_tokens_per_s", "none", 0, 12, 10, 1.2, "ratio >= 1", True),
        bench_row("b-new", "2026-02-01", "spec_tokens_per_s", "ngram", 2, 21, 20, 1.1, "ratio >= 1.15", False),
        bench_row("b-new", "2026-02-01", "adaptive_tokens_per_s", "ngram", 2, 24, 20, 1.2, k_policy="heuristic"),
        *(bench_row("b-new", "2026-02-01", "verify_ms", "none", k, ms, 70, ms / 70)
          for k, ms in ((0, 70), (1, 112), (2, 140))),
        *(bench_row("b-new", "2026-02-01", "verify_ms_stock", "none", k, ms, 100, ms / 100)
          for k, ms in ((0, 100), (1, 200), (2, 300))),
        bench_row("b-new", "2026-02-01", "verify_ms", "tree", 4, 105, 70, 1.5),
    ])
    return db
