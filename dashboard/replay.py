"""Run replay: one run's text with every token coloured by its fate, round by round, and its costs."""

from __future__ import annotations

import functools

import pandas as pd
import streamlit as st

from dashboard import charts, common, fates, filter_queries, queries, tokenizer, tree_layout, words
from runner.records import first_difference

RUNS_SHOWN = 1000  # runs the picker offers, newest first (and the picked one)
PICKER_COLUMNS = ["run_id", "started_at", "category", "prompt_id", "draft", "k", "k_policy", "mode", "kernels",
                  "threads", "batch_size", "repeat", "status"]


@st.cache_resource(show_spinner="loading the target's tokenizer…")
def _decoder(spec: str) -> tuple[fates.Decode, str | None]:
    """(id -> text, None), or (id -> '[id]', why) when the tokenizer cannot be loaded."""
    try:
        return tokenizer.load(spec), None
    except Exception as error:  # whatever went wrong, the replay still works on token ids
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return tokenizer.by_id, reason


def _open_run(run_id: str) -> None:
    # A callback runs before the page, so it may still set the URL-bound picker (and so the URL).
    st.session_state["run"] = run_id


def _pick_from_table(shown: list[str]) -> None:
    # `shown` is the table as drawn: a run recorded since then must not shift the picked row.
    rows = st.session_state["run_table"].selection.rows
    if rows:
        _open_run(shown[rows[0]])


def _picker() -> str | None:
    # The newest runs, and the one the URL or a button asks for however old: a million options would take seconds
    # to send and to search.
    asked = (*st.query_params.get_all("run"), *([st.session_state["run"]] if st.session_state.get("run") else []))
    filters = common.filter_widgets(common.load(filter_queries.filter_options), "replay")
    choices = common.load(queries.run_choices, RUNS_SHOWN, tuple(dict.fromkeys(asked)), filters)
    for missing in common.unknown_in_url("run", choices["run_id"].tolist()):
        st.warning(f"No run “{missing}” in this database: pick one below.")
    # The URL holds the option's text, so options are bare run ids: ?run=<run_id>.
    run_id = st.selectbox("run", choices["run_id"].tolist(), index=None, key="run", bind="query-params",
                          placeholder="pick a run id, or choose one in the table below")
    total = common.load(queries.run_count)
    shown = f": the newest {RUNS_SHOWN:,} of {total:,} (an older run opens by its link, replay?run=<run_id>)" \
        if total > RUNS_SHOWN else ""
    if filters != common.Filters():
        shown += " (those the sidebar's filters pick)"
    with st.expander(f"find a run{shown}", expanded=run_id is None):
        st.dataframe(choices[PICKER_COLUMNS], hide_index=True, key="run_table", selection_mode="single-row",
                     on_select=functools.partial(_pick_from_table, choices["run_id"].tolist()))
    return run_id


def _fmt(value: object, pattern: str, suffix: str = "") -> str:
    return "n/a" if value is None or pd.isna(value) else f"{value:{pattern}}{suffix}"


def _seconds(value: float | None) -> str:
    if value is None or pd.isna(value):  # an engine that does not time its rounds (vLLM)
        return "n/a"
    # Prompt lookup drafts in microseconds: seconds with two decimals would show it as 0.00.
    return f"{value:.2f} s" if value >= 1 else f"{value * 1000:.1f} ms"


def _divergence(run: pd.Series) -> str:
    """What a greedy mismatch was, in words; empty when there is none or it was recorded unclassified."""
    if pd.isna(run["lossless"]) or run["lossless"] or pd.isna(run["divergence"]):
        return ""
    if run["divergence"] == "unjudged":  # runner/vllm/engine.py: no logits come back to classify it by
        return f"unclassified, from token {int(run['divergence_at'])} on ({run['engine']} returns no logits)"
    kind = "a numeric tie" if run["divergence"] == "tie" else "a real divergence"
    return (f"{kind} at token {int(run['divergence_at'])}: the target's two best logits there are "
            f"{run['divergence_gap']:.3g} apart (tie tolerance {run['divergence_tolerance']:.3g} in {run['dtype']})")


def _cost_panel(run: pd.Series) -> None:
    lossless = "n/a" if pd.isna(run["lossless"]) else "✓" if run["lossless"] else "✗"
    if _divergence(run):
        lossless += " tie" if run["divergence"] == "tie" else " real"
    top, bottom = st.columns(4), st.columns(5)
    top[0].metric("rounds", f"{run['n_rounds']}")
    top[1].metric("drafts accepted / rejected / thrown",
                  f"{_fmt(run['accepted'], '.0f')} / {_fmt(run['rejected'], '.0f')} / {_fmt(run['thrown'], '.0f')}")
    top[2].metric("α", _fmt(run["alpha"], ".3f"), help=words.GLOSSARY["alpha"])
    top[3].metric("τ", _fmt(run["tau"], ".2f"), help=words.GLOSSARY["tau"])
    bottom[0].metric("draft time", _seconds(run["draft_s"]), help=f"c = {words.number(run['c'])}: one drafted "
                     "token's time over one one-token target pass")
    bottom[1].metric("verify time", _seconds(run["verify_s"]), help=f"wall time {run['wall_s']:.2f} s")
    bottom[2].metric("measured speedup", _fmt(run["measured_speedup"], ".2f", "×"),
                     help="baseline s/token ÷ this run's s/token")
    if _adaptive(run):
        bottom[3].metric("formula's prediction", "n/a", help=f"the formula assumes one k for every round; this run's "
                         f"{run['k_policy']} policy chose k round by round, starting from {int(run['k'])}")
    else:
        bottom[3].metric("formula's prediction", _fmt(run["theoretical_speedup"], ".2f", "×"),
                         help="(1 − α^(k+1)) / ((1 − α)(1 + k·c)) at this run's α, k and c")
    bottom[4].metric("lossless", lossless, help="greedy: the output equals the baseline's token for token "
                     "(n/a when sampling); a mismatch is a numeric tie (rounding) or a real divergence (a bug)")


def _setup(run: pd.Series) -> str:
    """The linears' path and the CPU threads; runs recorded before they were recorded say so."""
    threads = "threads not recorded" if pd.isna(run["threads"]) else f"{int(run['threads'])} threads"
    kernels = "kernels not recorded" if pd.isna(run["kernels"]) else f"{run['kernels']} kernels"
    return f"{kernels}, {threads}"


def _alongside(workers: float) -> str:
    """The concurrency mark: other workers of the sweep shared the machine (and its memory bandwidth)."""
    if pd.isna(workers) or workers <= 1:
        return ""
    return f" alongside {int(workers) - 1} other worker(s) of the sweep"


def _adaptive(run: pd.Series) -> bool:
    """The run's k changed round by round (a policy other than fixed)."""
    return isinstance(run["k_policy"], str) and run["k_policy"] != "fixed"


def _k(run: pd.Series) -> str:
    """The run's k as its rounds read it: a tree's k is its depth, its rounds' k its nodes."""
    if pd.isna(run["k"]):
        return ""
    if not pd.isna(run["tree_nodes"]):
        return f" depth k={int(run['k'])}, up to {int(run['tree_nodes'])} nodes a round"
    if _adaptive(run):
        return f" k from {int(run['k'])} · {run['k_policy']}"
    return f" k={int(run['k'])}"


def _header(run: pd.Series) -> None:
    st.subheader(f"{run['category']}/{run['prompt_id']} · {words.draft_name(run['draft'])}{_k(run)} · {run['mode']}")
    st.caption(f"run {run['run_id']} · sweep {run['sweep_id']} · target {run['target']} on {run['device']} "
               f"({run['dtype']}, {_setup(run)}) · temperature {run['temperature']:g}, top-p {run['top_p']:g}, "
               f"seed {run['seed']}"
               f" · {run['new_tokens']} of {run['max_new_tokens']} new tokens, stopped at {run['stop_reason']}"
               f" · recorded on {run['host']}{_alongside(run['concurrent_workers'])}")
    if divergence := _divergence(run):
        st.caption(f"lossless ✗: {divergence}")
    with st.expander("prompt"):
        st.text(run["prompt_text"])
    if isinstance(run["baseline_run_id"], str):
        # A button, not st.page_link: a page link back to this page runs the baseline but leaves the old
        # run in the URL, while setting the bound picker updates both.
        st.button(f"open the baseline run {run['baseline_run_id']}", icon=":material/compare_arrows:",
                  key="open_baseline", on_click=_open_run, args=(run["baseline_run_id"],))


def _steps_only(run: pd.Series, rounds: pd.DataFrame) -> None:
    """An engine that reports each verify step's counts but not its tokens (vLLM): the text, then the steps."""
    st.markdown("**Generated text**")
    st.text(run["output_text"])
    st.markdown("**Verify step by step**")
    st.caption(f"{run['engine']} reports how many drafts each step proposed and accepted, not which tokens nor how "
               "long it took. Steps that drafted nothing (prompt lookup found no match) it leaves out: they are the "
               "rounds with k = 0, recorded after the others (where they fell is not reported).")
    st.dataframe(rounds[["round", "k", "accepted", "rejected", "thrown", "bonus", "emitted"]], hide_index=True)


def _tokens(run: pd.Series, rounds: pd.DataFrame) -> None:
    decode, problem = _decoder(run["target"])
    if len(rounds) and rounds["draft_tokens"].isna().all():
        _steps_only(run, rounds)
        return
    if problem:
        st.caption(f"Showing token ids: the tokenizer of {run['target']} could not be loaded ({problem}).")
    sampled = run["mode"] == "sample"
    st.html(fates.CSS + fates.legend_html(sampled))
    st.markdown("**Generated text**")
    st.html(fates.text_html(fates.text_tokens(list(run["output_tokens"]), rounds), decode))
    if not pd.isna(run["lossless"]) and not run["lossless"]:
        at = first_difference(list(run["output_tokens"]), list(run["baseline_tokens"]))
        why = f" It is {_divergence(run)}." if _divergence(run) else ""
        st.warning(f"This output differs from its baseline's from token {at} on.{why}")
    st.markdown("**Round by round**: the drafts as proposed (a tree's nodes in node order), then the target's own "
                "token")
    st.html(fates.rounds_html(rounds, decode))
    if sampled:
        st.caption("Sampling: each judged draft x is accepted when the uniform draw u falls below min(1, p(x)/q(x)), "
                   "p the target's probability of x and q the draft's (a deterministic draft has q(x) = 1). After "
                   "a rejection the round's own token is the residual draw, from norm(max(0, p − q)); after all k "
                   "pass, the bonus comes from p. In a tree the test runs along the walk: a refused sibling leaves "
                   "the residual as the law the next sibling is tested against, and that law's p is shown.")
    _tree(run, rounds, decode)


def _tree(run: pd.Series, rounds: pd.DataFrame, decode: fates.Decode) -> None:
    """One tree round drawn, for a run that drafted trees; a chain's rounds have no tree to draw."""
    tree_rounds = [int(row["round"]) for _, row in rounds.iterrows() if fates.tree_parents(row) is not None]
    if not tree_rounds:
        return
    st.markdown("**A tree round**")
    picked = st.selectbox("round", tree_rounds, key="tree_round", bind="query-params",
                          help="the rounds that drafted a tree (a round whose nodes formed one chain is shown above)")
    row = rounds.set_index("round").loc[picked].to_dict()
    root = fates.roots(fates.text_tokens(list(run["output_tokens"]), rounds)).get(picked)
    st.altair_chart(charts.tree_round(tree_layout.layout(row, decode, root)))
    st.caption(f"Round {picked}: {int(row['k'])} nodes (the round's k; the run's k is the tree's depth), "
               f"{int(row['accepted'])} accepted, "
               f"{int(row['rejected'])} rejected, {int(row['thrown'])} thrown. The root is the newest committed "
               "token; the target followed the thick path, and where it stopped either every child was refused "
               "(red) or it was a leaf (the bonus). Hover a node for its token and the target's.")


def render() -> None:
    st.title("Run replay")
    if not common.require_data(common.db_path()):
        return
    run_id = _picker()
    if run_id is None:
        return
    run = common.load(queries.run_detail, run_id).iloc[0]
    _header(run)
    if run["status"] != "ok":
        st.error(f"This run failed: {run['error']}")
        return
    _cost_panel(run)
    _tokens(run, common.load(queries.run_rounds, run_id))


if __name__ == "__main__":  # st.navigation runs each page file as __main__
    with common.one_connection():
        render()
