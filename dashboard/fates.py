"""What happened to every token of a run, from its `rounds` rows, and the replay's HTML; pure.

The prefill's pass over the prompt makes the first new token. Then a round's drafts are accepted (left
to right while the target agrees), then at most one rejected, then thrown (never judged). The round
emits the accepted drafts plus one target token: the correction after a rejection, the bonus when all k
were accepted, or a plain token when nothing was drafted (k = 0: a baseline, or prompt lookup finding
no match). EOS or max_new_tokens can cut it.

A tree round (`draft_parents` recorded) keeps the tokens of its accepted path, from the root down; the children
of the node where the path stopped were all refused (rejected), and every other node was thrown.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import pandas as pd
from pandas.api.types import is_list_like

ROOT = -1  # a node's parent when it hangs from the newest committed token
Decode = Callable[[int], str]
LABELS = {"prefill": "from the prefill", "accepted": "accepted draft", "correction": "correction",
          "residual": "residual draw", "bonus": "bonus",
          "plain": "plain (no draft)", "rejected": "rejected draft", "thrown": "thrown draft"}
CSS = """<style>
.specdash-tokens { white-space: pre-wrap; line-height: 1.9; font-family: ui-monospace, monospace; font-size: 0.9rem; }
.specdash-tokens span { border-radius: 3px; padding: 1px 1px; margin-right: 1px; }
.tok-prefill { background: #e8e0f5; }
.tok-accepted { background: #c8ecc9; }
.tok-correction { background: #ffd59e; font-weight: 600; }
.tok-residual { background: #ffc2e0; font-weight: 600; }
.tok-bonus { background: #c9dbff; font-weight: 600; }
.tok-plain { background: #eeeeee; }
.tok-rejected { background: #ffd2d2; color: #b00020; text-decoration: line-through; }
.tok-thrown { color: #9e9e9e; text-decoration: line-through; }
.specdash-rounds { max-height: 32rem; overflow-y: auto; }
.specdash-rounds table { border-collapse: collapse; font-size: 0.85rem; width: 100%; }
.specdash-rounds td, .specdash-rounds th { border-bottom: 1px solid #eee; padding: 2px 6px; text-align: left; }
.specdash-rounds td.num { text-align: right; font-variant-numeric: tabular-nums; }
.specdash-rounds td.test { font-family: ui-monospace, monospace; font-size: 0.8rem; white-space: pre; }
</style>"""


@dataclass(frozen=True)
class Token:
    token_id: int
    fate: str  # a key of LABELS
    round: int


def tree_parents(row: Mapping) -> list[int] | None:
    """A tree round's parent of every node (ROOT: the newest committed token); None for a chain."""
    parents = row.get("draft_parents")
    return [int(parent) for parent in parents] if is_list_like(parents) else None


def node_fates(parents: Sequence[int], path: Sequence[int]) -> list[str]:
    """Each node's fate: accepted on the path; rejected, a child of the node where the path stopped (the target
    refused them all; a leaf has none: the bonus); thrown, the rest."""
    stop = path[-1] if len(path) else ROOT
    return ["accepted" if node in path else "rejected" if parent == stop else "thrown"
            for node, parent in enumerate(parents)]


def target_after(row: Mapping) -> dict[int, int]:
    """A tree round's target token after each node it was recorded for (ROOT: after the root). Greedy records the
    target's argmax at every row, the root's then each node's; sampling only the path's tokens and its own."""
    target, path = [int(t) for t in row["target_tokens"]], [int(node) for node in row["accepted_path"]]
    if len(target) == len(row["draft_tokens"]) + 1:
        return {node: token for node, token in enumerate(target, start=ROOT)}
    return dict(zip([ROOT, *path], target, strict=True))


def _kept(row: Mapping) -> list[int]:
    """The accepted drafts, then the target's own token after them."""
    if tree_parents(row) is None:
        return list(row["draft_tokens"][: row["accepted"]]) + list(row["target_tokens"][row["accepted"]:][:1])
    path = [int(node) for node in row["accepted_path"]]
    return [row["draft_tokens"][node] for node in path] + [target_after(row)[path[-1] if path else ROOT]]


def emitted(row: pd.Series) -> list[Token]:
    """The tokens one round appended to the text, with their fates."""
    kept = _kept(row)
    # A sampled rejection's token is drawn from norm(max(0, p − q)): the residual draw, not a greedy correction.
    flag = row.get("from_residual")
    residual = flag is not None and not pd.isna(flag) and bool(flag)
    own = "plain" if row["k"] == 0 else ("residual" if residual else "correction") if row["rejected"] else "bonus"
    return [Token(int(t), "accepted" if i < row["accepted"] else own, int(row["round"]))
            for i, t in enumerate(kept[: row["emitted"]])]


def drafts(row: pd.Series) -> list[Token]:
    """The round's k drafts where they were proposed (a tree's nodes in node order): accepted, rejected (a chain's
    one, or a tree's refused children at its stop), thrown."""
    parents = tree_parents(row)
    if parents is None:
        fates = ["accepted"] * row["accepted"] + ["rejected"] * row["rejected"] + ["thrown"] * row["thrown"]
    else:
        fates = node_fates(parents, [int(node) for node in row["accepted_path"]])
    return [Token(int(t), fate, int(row["round"])) for t, fate in zip(row["draft_tokens"], fates, strict=True)]


def text_tokens(output: Sequence[int], rounds: pd.DataFrame) -> list[Token]:
    """The run's output, token by token, in order: what no round emitted came from the prefill."""
    made = [token for _, row in rounds.iterrows() for token in emitted(row)]
    return [Token(int(t), "prefill", -1) for t in output[: len(output) - len(made)]] + made


def roots(tokens: Sequence[Token]) -> dict[int, int]:
    """Each round's root, the newest committed token before it: the text's token before the round's first."""
    found = {}
    for before, token in zip(tokens, tokens[1:], strict=False):
        if token.round != before.round:
            found.setdefault(token.round, before.token_id)
    return found


def _span(token: Token, decode: Decode, breaks: bool = True) -> str:
    # A newline shows as ⏎; in the text it still breaks the line, so the text keeps its shape.
    shown = html.escape(decode(token.token_id)).replace("\n", "⏎\n" if breaks else "⏎")
    where = "prefill" if token.round < 0 else f"round {token.round} · {LABELS[token.fate]}"
    title = html.escape(f"{where} · id {token.token_id}", quote=True)
    return f'<span class="tok-{token.fate}" data-fate="{token.fate}" title="{title}">{shown}</span>'


def text_html(tokens: Sequence[Token], decode: Decode) -> str:
    """The generated text with every token coloured by its fate."""
    return f'<div class="specdash-tokens">{"".join(_span(t, decode) for t in tokens)}</div>'


def legend_html(sampled: bool = False) -> str:
    fates = ("prefill", "accepted", "residual" if sampled else "correction", "bonus", "plain", "rejected", "thrown")
    chips = " ".join(f'<span class="tok-{fate}">{LABELS[fate]}</span>' for fate in fates)
    return f'<div class="specdash-tokens">{chips}</div>'


def judged_nodes(parents: Sequence[int], path: Sequence[int]) -> list[int]:
    """The nodes a sampled tree's walk judged, in the order judged (ascending ids), as `rounds.draft_p` lists them:
    at each row on the path its children up to the accepted one, and where the path stopped every child."""
    kids: dict[int, list[int]] = {}
    for node, parent in enumerate(parents):
        kids.setdefault(parent, []).append(node)
    judged, row = [], ROOT
    for node in path:
        judged += [c for c in kids.get(row, []) if c <= node]
        row = node
    return judged + kids.get(row, [])


def sampling_test(row: Mapping) -> list[tuple[int, float, float, float, bool]]:
    """A sampled round's test per judged draft: (token, p(x), q(x), u, accepted), accepted iff u < min(1, p/q);
    empty for a greedy round or one recorded before the test was."""
    if not is_list_like(row.get("draft_p")):
        return []
    parents = tree_parents(row)
    nodes = (judged_nodes(parents, [int(n) for n in row["accepted_path"]]) if parents is not None
             else range(len(row["draft_p"])))
    return [(int(row["draft_tokens"][node]), p, q, u, u < min(1.0, p / q) if q > 0 else False)
            for node, p, q, u in zip(nodes, row["draft_p"], row["draft_q"], row["draft_u"], strict=True)]


def _test_html(row: Mapping, decode: Decode) -> str:
    """One line per judged draft: its token, p, q, min(1, p/q) and the draw u, ✓ when u fell below."""
    lines = []
    for token, p, q, u, ok in sampling_test(row):
        shown = html.escape(decode(token).replace("\n", "⏎"))
        bound = min(1.0, p / q) if q > 0 else 0.0
        lines.append(f"{shown!s:>8}  p {p:.3f}  q {q:.3f}  min(1, p/q) {bound:.3f}  u {u:.3f}  "
                     f"{'✓ u < min' if ok else '✗ u ≥ min'}")
    return "\n".join(lines)


def _ms(seconds: float) -> str:
    # Prompt lookup drafts in microseconds: milliseconds with one decimal would show it as 0.0.
    return f"{seconds * 1e6:.0f} µs" if seconds < 1e-4 else f"{seconds * 1e3:.1f} ms"


def _verify(row: Mapping) -> str:
    """The pass's time and, where recorded, its rows: the newest token, the drafts and any never judged (lookahead's
    window), so a wide pass shows why it took longer."""
    rows = row.get("pass_rows")
    return _ms(row["verify_s"]) + ("" if rows is None or pd.isna(rows) else f" · {int(rows)} rows")


def rounds_html(rounds: pd.DataFrame, decode: Decode) -> str:
    """One row per round, like the explainer's one-round view: the drafts as proposed, then what the
    target added (correction, residual draw, bonus or plain token); sampled rounds also show the test of each
    judged draft."""
    sampled = "draft_p" in rounds and rounds["draft_p"].map(is_list_like).any()
    head = ("<tr><th>round</th><th>k</th><th>drafts as proposed</th><th>target adds</th>"
            "<th>acc/rej/thrown</th><th>draft</th><th>verify</th>"
            + ("<th>sampling test: accept when u &lt; min(1, p/q)</th>" if sampled else "") + "</tr>")
    rows = []
    for _, row in rounds.iterrows():
        proposed = "".join(_span(t, decode, breaks=False) for t in drafts(row))
        added = "".join(_span(t, decode, breaks=False) for t in emitted(row) if t.fate != "accepted")
        test = f'<td class="test">{_test_html(row, decode)}</td>' if sampled else ""
        rows.append(
            f'<tr data-round="{int(row["round"])}"><td class="num">{int(row["round"])}</td>'
            f'<td class="num">{int(row["k"])}</td><td class="specdash-tokens">{proposed}</td>'
            f'<td class="specdash-tokens">{added}</td>'
            f'<td class="num">{int(row["accepted"])}/{int(row["rejected"])}/{int(row["thrown"])}</td>'
            f'<td class="num">{_ms(row["draft_s"])}</td><td class="num">{_verify(row)}</td>{test}</tr>')
    return f'<div class="specdash-rounds"><table>{head}{"".join(rows)}</table></div>'
