"""Trained drafts: how each draft head recorded by `runner train-draft` learned, epoch by epoch, and how its
head then did per category in the recorded runs of `eagle:<dir>` (joined on the draft's text)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import charts, common, queries
from runner.store import metrics

HELDOUT = "held-out prompts (training)"


def loss_frame(epochs: pd.DataFrame) -> pd.DataFrame:
    """One row per epoch × source ('training', 'held-out'); epoch 0 has no training loss."""
    per_epoch = epochs.drop_duplicates("epoch")
    long = per_epoch.melt(id_vars="epoch", value_vars=["train_loss", "heldout_loss"], var_name="source",
                          value_name="loss").dropna(subset=["loss"])
    return long.replace({"source": {"train_loss": "training", "heldout_loss": "held-out"}})


def positions_frame(recorded: pd.DataFrame, epochs: pd.DataFrame, saved_epoch: int) -> pd.DataFrame:
    """Acceptance by draft position: each category's recorded greedy runs, and the saved epoch's held-out score."""
    runs = recorded[recorded["mode"] == "greedy"].assign(series=lambda f: f["category"], source="recorded runs")
    heldout = epochs[epochs["epoch"] == saved_epoch].assign(series=HELDOUT, source=HELDOUT)
    columns = ["series", "source", "position", "judged", "accepted", "acceptance"]
    return pd.concat([runs[columns], heldout[columns]], ignore_index=True)


def _resumed(t: pd.Series) -> str:
    epoch = t.get("resumed_epoch")
    return "" if epoch is None or pd.isna(epoch) else f" (resumed after epoch {int(epoch)})"


def _context(t: pd.Series) -> str:
    learned = t.get("learn_context")
    return " · learned the prompts' text too" if pd.notna(learned) and bool(learned) else ""


def _header(t: pd.Series) -> None:
    st.caption(
        f"training {t.name} · {t['started_at']:%Y-%m-%d %H:%M} UTC · {t['status']} · target {t['target']} · "
        f"{t['train_prompts']} prompts, {t['train_tokens']:,} answer tokens ({t['heldout_prompts']} held out, "
        f"{t['heldout_tokens']:,} tokens) · draft vocabulary {t['draft_vocab']:,} covering "
        f"{t['vocab_coverage']:.1%} of the answer tokens · layers {', '.join(str(int(x)) for x in t['layers'])} · "
        f"unroll {t['unroll']}{_context(t)} · epoch {t['saved_epoch']} of {t['epochs']} saved{_resumed(t)} · "
        f"data {t['data_s']:.0f} s"
        f"{' (cached)' if t['data_cached'] else ''}, training {t['train_s']:.0f} s, {t['wall_s'] / 60:.1f} min in "
        f"all on {t['device']} ({t['threads']} threads, load average {t['load_before']:.1f}"
        f" → {t['load_after']:.1f})")
    st.code(t["command"], language="bash")


def _learned(epochs: pd.DataFrame) -> None:
    st.subheader("How it learned")
    left, right = st.columns(2)
    left.altair_chart(charts.training_loss(loss_frame(epochs)))
    right.altair_chart(charts.training_acceptance(epochs))
    st.caption("Held-out acceptance at draft position j: how often the head's j-th draft equals the target's own "
               "token on prompts it never trained on, counting only where drafts 1..j-1 were right, as a greedy "
               "round judges them. The saved epoch is the one with the most drafts accepted at k = unroll.")


def _by_category(train_id: str) -> None:
    frame = common.load(queries.training_categories, train_id)
    if frame.empty:
        return
    st.subheader("Held-out acceptance per category")
    st.altair_chart(charts.training_categories(frame))
    st.caption("The same score per kind of held-out prompt: a head that learns only some kinds of text shows it "
               "here while it trains.")


def _drafted(t: pd.Series, epochs: pd.DataFrame) -> None:
    st.subheader(f"How `{t['draft']}` drafts")
    per_category = common.load(metrics.draft_categories, metrics.Filters(target=(t["target"],), draft=(t["draft"],)))
    if per_category.empty:
        st.info("No recorded run uses this head yet. Record some, for example:")
        st.code(f"python -m runner sweep --target {t['target']} --draft {t['draft']} --draft ngram --k 1,2,3,4",
                language="bash")
        return
    st.dataframe(per_category.drop(columns=["target", "draft"]), hide_index=True, column_config={
        "alpha": st.column_config.NumberColumn("α", format="%.3f"),
        "best_speedup": st.column_config.NumberColumn("speedup at best k", format="%.2f×"),
        "tau_at_best_k": st.column_config.NumberColumn("τ at best k", format="%.2f")})
    recorded = common.load(queries.draft_positions, t["target"], t["draft"])
    axis = charts.position_title({t["draft"]}, set(common.load(queries.tree_drafts)))
    st.altair_chart(charts.position_acceptance(positions_frame(recorded, epochs, int(t["saved_epoch"])), axis))
    st.markdown(f"Side by side with the other drafts: [Compare drafts](compare?a={t['draft']}&b=ngram).")


def render() -> None:
    st.title("Trained drafts")
    if not common.require_data(common.db_path(), need_runs=False):
        return
    trainings = common.load(queries.trainings)
    if trainings.empty:
        st.info("No draft training is recorded in this file. `python -m runner train-draft --out DIR --db PATH` "
                "trains a head for a target and records every epoch here.")
        return
    st.dataframe(trainings[["train_id", "started_at", "status", "target", "draft", "train_tokens", "epochs",
                            "saved_epoch", "heldout_first_acceptance", "runs"]], hide_index=True,
                 column_config={"heldout_first_acceptance": st.column_config.NumberColumn(
                     "held-out acceptance, 1st draft", format="%.3f")})
    ids = trainings["train_id"].tolist()
    for missing in common.unknown_in_url("train", ids):
        st.warning(f"No training “{missing}” in this database: pick one below.")
    # The URL holds the option's text, so options are bare ids (?train=<id>). Without one, the page opens on the
    # training whose head was used most, then trained longest: not on whichever test head came last.
    default = trainings.sort_values(["runs", "epochs", "started_at"], ascending=False).index[0]
    train_id = st.selectbox("training", ids, index=ids.index(trainings.loc[default, "train_id"]), key="train",
                            bind="query-params", help="the table above names each training's draft")
    t = trainings.set_index("train_id").loc[train_id]  # t.name is the id
    _header(t)
    epochs = common.load(queries.training_epochs, train_id)
    if epochs.empty:
        st.info("This training has recorded no epoch yet.")
        return
    _learned(epochs)
    _by_category(train_id)
    _drafted(t, epochs)


if __name__ == "__main__":  # st.navigation runs each page file as __main__
    render()
