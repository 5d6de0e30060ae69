"""What happened to every token of a run, from its `rounds` rows, and the replay's HTML; pure.

The prefill's pass over the prompt makes the first new token. Then a round's drafts are accepted (left
to right while the target agrees), then at most one rejected, then thrown (never judged). The round
emits the accepted drafts plus one target token: the correction after a rejection, the bonus when all k
were accepted, or a plain token when nothing was drafted (k = 0: a baseline, or prompt lookup finding
no match). EOS or max_new_tokens can cut it.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pandas as pd

Decode = Callable[[int], str]
LABELS = {"prefill": "from the prefill", "accepted": "accepted draft", "correction": "correction", "bonus": "bonus",
          "plain": "plain (no draft)", "rejected": "rejected draft", "thrown": "thrown draft"}
CSS = """<style>
.specdash-tokens { white-space: pre-wrap; line-height: 1.9; font-family: ui-monospace, monospace; font-size: 0.9rem; }
.specdash-tokens span { border-radius: 3px; padding: 1px 1px; margin-right: 1px; }
.tok-prefill { background: #e8e0f5; }
.tok-accepted { background: #c8ecc9; }
.tok-correction { background: #ffd59e; font-weight: 600; }
.tok-bonus { background: #c9dbff; font-weight: 600; }
.tok-plain { background: #eeeeee; }
.tok-rejected { background: #ffd2d2; color: #b00020; text-decoration: line-through; }
.tok-thrown { color: #9e9e9e; text-decoration: line-through; }
.specdash-rounds { max-height: 32rem; overflow-y: auto; }
.specdash-rounds table { border-collapse: collapse; font-size: 0.85rem; width: 100%; }
.specdash-rounds td, .specdash-rounds th { border-bottom: 1px solid #eee; padding: 2px 6px; text-align: left; }
.specdash-rounds td.num { text-align: right; font-variant-numeric: tabular-nums; }
</style>"""


@dataclass(frozen=True)
class Token:
    token_id: int
    fate: str  # a key of LABELS
    round: int


def emitted(row: pd.Series) -> list[Token]:
    """The tokens one round appended to the text, with their fates."""
    kept = list(row["draft_tokens"][: row["accepted"]]) + list(row["target_tokens"][row["accepted"]:][:1])
    own = "plain" if row["k"] == 0 else "correction" if row["rejected"] else "bonus"
    return [Token(int(t), "accepted" if i < row["accepted"] else own, int(row["round"]))
            for i, t in enumerate(kept[: row["emitted"]])]


def drafts(row: pd.Series) -> list[Token]:
    """The round's k drafts where they were proposed: accepted, rejected (at most one), thrown."""
    fates = ["accepted"] * row["accepted"] + ["rejected"] * row["rejected"] + ["thrown"] * row["thrown"]
    return [Token(int(t), fate, int(row["round"])) for t, fate in zip(row["draft_tokens"], fates, strict=True)]


def text_tokens(output: Sequence[int], rounds: pd.DataFrame) -> list[Token]:
    """The run's output, token by token, in order: what no round emitted came from the prefill."""
    made = [token for _, row in rounds.iterrows() for token in emitted(row)]
    return [Token(int(t), "prefill", -1) for t in output[: len(output) - len(made)]] + made


def _span(token: Token, decode: Decode, breaks: bool = True) -> str:
    # A newline shows as ⏎; in the text it still breaks the line, so the text keeps its shape.
    shown = html.escape(decode(token.token_id)).replace("\n", "⏎\n" if breaks else "⏎")
    where = "prefill" if token.round < 0 else f"round {token.round} · {LABELS[token.fate]}"
    title = html.escape(f"{where} · id {token.token_id}", quote=True)
    return f'<span class="tok-{token.fate}" data-fate="{token.fate}" title="{title}">{shown}</span>'


def text_html(tokens: Sequence[Token], decode: Decode) -> str:
    """The generated text with every token coloured by its fate."""
    return f'<div class="specdash-tokens">{"".join(_span(t, decode) for t in tokens)}</div>'


def legend_html() -> str:
    fates = ("prefill", "accepted", "correction", "bonus", "plain", "rejected", "thrown")
    chips = " ".join(f'<span class="tok-{fate}">{LABELS[fate]}</span>' for fate in fates)
    return f'<div class="specdash-tokens">{chips}</div>'


def rounds_html(rounds: pd.DataFrame, decode: Decode) -> str:
    """One row per round, like the explainer's one-round view: the drafts as proposed, then what the
    target added (correction, bonus or plain token)."""
    head = ("<tr><th>round</th><th>k</th><th>drafts as proposed</th><th>target adds</th>"
            "<th>acc/rej/thrown</th><th>draft ms</th><th>verify ms</th></tr>")
    rows = []
    for _, row in rounds.iterrows():
        proposed = "".join(_span(t, decode, breaks=False) for t in drafts(row))
        added = "".join(_span(t, decode, breaks=False) for t in emitted(row) if t.fate != "accepted")
        rows.append(
            f'<tr data-round="{int(row["round"])}"><td class="num">{int(row["round"])}</td>'
            f'<td class="num">{int(row["k"])}</td><td class="specdash-tokens">{proposed}</td>'
            f'<td class="specdash-tokens">{added}</td>'
            f'<td class="num">{int(row["accepted"])}/{int(row["rejected"])}/{int(row["thrown"])}</td>'
            f'<td class="num">{row["draft_s"] * 1e3:.1f}</td><td class="num">{row["verify_s"] * 1e3:.1f}</td></tr>')
    return f'<div class="specdash-rounds"><table>{head}{"".join(rows)}</table></div>'


def first_difference(output: Sequence[int], baseline: Sequence[int]) -> int | None:
    """The first position where a run's output leaves its baseline's, or None when they are equal."""
    for i, (mine, theirs) in enumerate(zip(output, baseline, strict=False)):
        if mine != theirs:
            return i
    return None if len(output) == len(baseline) else min(len(output), len(baseline))
