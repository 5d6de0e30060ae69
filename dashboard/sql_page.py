"""SQL: one read-only statement over the documented schema, sandboxed exactly like `runner sql`."""

from __future__ import annotations

import math

import streamlit as st

from dashboard import common, queries, words
from runner.store.sql import EXAMPLES, OVERVIEW, QueryError, QueryResult, run_query

MAX_ROWS = 100_000
PAGE_SIZES = (25, 100, 500)


def _run(sql: str) -> None:
    """Run `sql` (the placeholder, the Overview's query, when the editor is empty) and keep its result (or refusal)
    for the reruns that follow, e.g. the download's and the pager's."""
    try:
        st.session_state["sql_result"] = run_query(common.db_path(), sql.strip() or OVERVIEW, max_rows=MAX_ROWS)
    except QueryError as error:
        st.session_state["sql_result"] = error
    st.session_state["sql_page"] = 1


def _use_example(sql: str) -> None:
    st.session_state["sql"] = sql  # a callback may set the URL-bound editor before it is drawn
    _run(sql)


def _examples() -> None:
    st.caption("Examples (one click loads and runs one)")
    with st.container(horizontal=True):
        for i, (name, sql) in enumerate(EXAMPLES.items()):
            st.button(name, key=f"example_{i}", on_click=_use_example, args=(sql,))


def _why_empty(result: QueryResult) -> None:
    """No row: name each condition no run meets, and what that column holds (a technique named for its spec)."""
    if not result.unmatched:
        st.info("No row matched. No `column = 'value'` condition on `runs` is to blame: every such value exists; "
                "the combination, a join or another condition emptied it.")
        return
    specs = {technique: kind for kind, technique in words.TECHNIQUES.items()}
    for column, value, held in result.unmatched:
        hint = f" “{value}” is the technique; its spec is `{specs[value]}`." if value in specs else ""
        st.info(f"No row: no run has {column} = '{value}'.{hint} {column} holds: "
                + ", ".join(f"`{v}`" for v in held) + ("…" if len(held) >= 12 else ""))


def _result(result: QueryResult | QueryError) -> None:
    if isinstance(result, QueryError):
        st.error(str(result))
        return
    rows = len(result.frame)
    st.caption(f"{rows:,} row{'s' if rows != 1 else ''} in {result.elapsed_s * 1000:.0f} ms")
    if result.truncated:
        st.warning(f"Showing the first {MAX_ROWS:,} rows: the query returned more. Add a LIMIT or aggregate.")
    if rows == 0:
        _why_empty(result)
        return
    left, right = st.columns([1, 3])
    size = left.selectbox("rows per page", PAGE_SIZES, key="sql_page_size")
    pages = math.ceil(rows / size)
    page = right.number_input(f"page (of {pages:,})", 1, pages, key="sql_page") if pages > 1 else 1
    start = (page - 1) * size
    shown = result.frame.iloc[start:start + size]
    st.dataframe(shown, hide_index=True, height=min(35 * (len(shown) + 1) + 3, 720))
    st.caption(f"rows {start + 1:,}–{start + len(shown):,} of {rows:,}")
    st.download_button("Download CSV (every row)", result.frame.to_csv(index=False), file_name="specdash-query.csv",
                       mime="text/csv", on_click="ignore", icon=":material/download:")


def _schema() -> None:
    with st.expander("schema: tables, views and the metric macros"):
        columns = common.load(queries.schema)
        tables = list(dict.fromkeys(columns["table_name"]))
        picked = st.selectbox("table or view", tables, index=tables.index("run_stats") if "run_stats" in tables
                              else 0, key="schema_table")
        rows = columns[columns["table_name"] == picked][["column_name", "data_type"]]
        st.table(rows.rename(columns={"column_name": "column", "data_type": "type"}).set_index("column"))
        st.markdown("**Metric macros** (every page computes its numbers with these)")
        st.table(common.load(queries.macros).set_index("macro"))


def render() -> None:
    st.title("SQL")
    if not common.require_data(common.db_path(), need_runs=False):
        return
    st.caption("One read statement (SELECT, WITH, DESCRIBE, SHOW, EXPLAIN) on a read-only connection without "
               "file access; 5 s and 512 MB at most. Tables: runs, rounds; views: run_stats (a row per run), "
               "comparable_runs (the runs the Overview pools). Run on an empty editor: the placeholder, the "
               "Overview's table by its rule.")
    _examples()
    sql = st.text_area("query", key="sql", bind="query-params", height=220, placeholder=OVERVIEW)
    # The URL may carry a query: it fills the editor but runs only on a click.
    if st.button("Run", key="run_sql", type="primary", icon=":material/play_arrow:"):
        _run(sql or "")
    if "sql_result" in st.session_state:
        _result(st.session_state["sql_result"])
    _schema()


if __name__ == "__main__":  # st.navigation runs each page file as __main__
    render()
