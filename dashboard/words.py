"""The words a newcomer reads: one name per draft (the technique, then its spec), the glossary shown on hover, and
sweeps named by what they ran and when. Pure Python; the pages pass these to `help=` and `format_func=`."""

from __future__ import annotations

import pandas as pd

# A draft kind's technique, as the papers and the docs name it; the spec (what `--draft` takes) follows in brackets.
TECHNIQUES = {
    "ngram": "prompt lookup", "ngram-tree": "prompt lookup tree", "layerskip": "layer skip",
    "model": "draft model", "eagle": "EAGLE head", "eagle-tree": "EAGLE-2 tree", "hybrid": "hybrid tree",
    "medusa": "Medusa heads", "medusa-tree": "Medusa tree", "recycling": "token recycling",
    "lookahead": "lookahead decoding", "none": "plain decoding",
}

GLOSSARY = {
    "k": "k: drafts proposed per round (a tree: its depth). With an adaptive policy, the k it starts from.",
    "alpha": "α (acceptance rate): accepted / (accepted + rejected) drafts; thrown drafts, never judged, are not in "
             "it. Pooled over the cell's runs; the range is its prompts' lowest and highest.",
    "tau": "τ (mean accepted length): tokens emitted per round, ≥ 1 (the accepted drafts plus the target's own).",
    "c": "c: one drafted token's time / one target pass of one token, measured. 0.001 means drafting is nearly "
         "free (prompt lookup); 0.4 means a draft token costs 40% of a target pass.",
    "speedup": "speedup: plain decoding's seconds per token / this run's, same prompt and setup. A cell's is the "
               "geometric mean over its prompts (a prompt's repeats pooled first); the interval is a 95% "
               "t-interval over prompts.",
    "kernels": "kernels: how the target's linear layers run on CPU. skinny: a matmul chosen per weight shape that "
               "reads each weight once for a few rows (what makes verifying k drafts cheap); stock: PyTorch's "
               "F.linear.",
    "k_policy": "policy: how each round's k is chosen. fixed: always k; heuristic: +2 after a fully accepted round, "
                "−1 otherwise (transformers'); auto: the k the measured costs predict best; confidence:t: stop "
                "drafting once the draft's top probability is below t.",
    "threads": "threads: torch CPU threads during the run.",
    "batch_size": "batch: sequences decoded together in one target pass; its speedup is against plain decoding of "
                  "the same batch.",
    "tie": "tie: the runner-up's 95% interval overlaps the winner's, or either has fewer than 2 prompts, so the "
           "data cannot tell them apart.",
    "prompts": "prompts: the prompts the cell's number pools, those every compared cell of its setup × category "
               "ran.",
    "sweep_id": "sweep: one `runner sweep` command's runs, named by what it ran and when it started.",
    "draft": "draft: the technique, then its spec as `--draft` takes it (prompt lookup is `ngram`).",
    "lossless": "lossless: the share of greedy runs whose output equals the baseline's token for token; a mismatch is "
                "a real divergence (a bug), a numeric tie (the target's contested logits within rounding of each "
                "other) or unjudged (no logits came back to tell, or it was recorded before mismatches were "
                "classified).",
}
# A mismatch's classes (`metrics.LOSSLESS`), the one that is a bug first: column, one, many.
_MISMATCHES = (("real_divergences", "real divergence", "real divergences"),
               ("numeric_ties", "numeric tie", "numeric ties"), ("unjudged", "unjudged", "unjudged"))

# A filter's title in the sidebar where its column's name is not what a reader calls it.
FILTER_TITLES = {"k_policy": "policy", "batch_size": "batch size", "sweep_id": "sweep",
                 "concurrent_workers": "workers alongside"}


def draft_name(spec: str) -> str:
    """'prompt lookup (ngram)', 'EAGLE head (eagle:heads/smollm2-135m)': every page writes a draft this way."""
    if spec == "none":
        return TECHNIQUES["none"]
    technique = TECHNIQUES.get(spec.split(":", 1)[0])
    return f"{technique} ({spec})" if technique else spec


def _listed(values: object) -> str:
    return ", ".join(str(v) for v in (values if values is not None else []))


def sweep_label(row: pd.Series) -> str:
    """'12-05 11:00 · prompt lookup, EAGLE head · greedy · fixed, auto · skinny · 1 thread · batch 1, 4 · 92 runs
    (20261205-110026-5e50)': what it ran and when, then its id."""
    drafts = _listed(TECHNIQUES.get(kind, kind) for kind in (row["kinds"] if row["kinds"] is not None else []))
    threads = _listed(row["threads"])
    parts = [f"{row['started']:%m-%d %H:%M}", drafts, _listed(row["modes"]), _listed(row["policies"]),
             f"{_listed(row['kernels'])} kernels", f"{threads} thread{'s' * (threads != '1')}"]
    if list(row["batches"]) != [1]:
        parts.append(f"batch {_listed(row['batches'])}")
    return " · ".join([p for p in parts if p] + [f"{int(row['runs'])} runs ({row['sweep_id']})"])


def lossless(counts: dict) -> str:
    """'100%', '75% (1 real divergence, 2 numeric ties)', 'n/a (sampling)': of the runs checked against their
    baseline, the share equal to it, then what the mismatches were (`counts` holds `metrics.LOSSLESS`'s)."""
    if not counts["checked"]:
        return "n/a (sampling)"
    found = [(int(counts[column]), one, many) for column, one, many in _MISMATCHES]
    equal = counts["checked"] - sum(n for n, _, _ in found)
    notes = [f"{n} {one if n == 1 else many}" for n, one, many in found if n]
    return f"{equal / counts['checked']:.0%}" + (f" ({', '.join(notes)})" if notes else "")


def number(value: float, digits: int = 3) -> str:
    """`digits` significant digits, so a small c reads 0.00123, not 0.000."""
    return "n/a" if value is None or pd.isna(value) else f"{value:.{digits}g}"
