"""SQL: one read-only statement over the documented schema, sandboxed exactly like `runner sql`."""

from __future__ import annotations

import streamlit as st

from dashboard import common, queries
from runner.store.sql import EXAMPLES, QueryError, QueryResult, run_query

MAX_ROWS = 10_000


def _run(sql: str) -> None:
    """Run `sql` and keep its result (or refusal) for the reruns that follow, e.g. the download's."""
    try:
        st.session_state["sql_result"] = run_query(common.db_path(), sql, max_rows=MAX_ROWS)
    except QueryError as error:
        st.session_state["sql_result"] = error


def _use_example(sql: str) -> None:
    st.session_state["sql"] = sql  # a callback may set the URL-bound editor before it is drawn
    _run(sql)


def _examples() -> None:
    st.caption("Examples (one click loads and runs one)")
    with st.container(horizontal=True):
        for i, (name, sql) in enumerate(EXAMPLES.items()):
            st.button(name, key=f"example_{i}", on_click=_use_example, args=(sql,))


def _result(result: QueryResult | QueryError) -> None:
    if isinstance(result, QueryError):
        st.error(str(result))
        return
    rows = len(result.frame)
    st.caption(f"{rows:,} row{'s' if rows != 1 else ''} in {result.elapsed_s * 1000:.0f} ms")
    if result.truncated:
        st.warning(f"Showing the first {MAX_ROWS:,} rows: the query returned more. Add a LIMIT or aggregate.")
    st.dataframe(result.frame, hide_index=True)
    st.download_button("Download CSV", result.frame.to_csv(index=False), file_name="specdash-query.csv",
                       mime="text/csv", on_click="ignore", icon=":material/download:")


def _schema() -> None:
    with st.expander("schema: tables and columns"):
        columns = common.load(queries.schema)
        for table, group in columns.groupby("table_name", sort=False):
            listed = ", ".join(f"`{name}` {kind}" for name, kind in zip(group["column_name"], group["data_type"],
                                                                         strict=True))
            st.markdown(f"**{table}**: {listed}")


def render() -> None:
    st.title("SQL")
    if not common.require_data(common.db_path(), need_runs=False):
        return
    st.caption("One read statement (SELECT, WITH, DESCRIBE, SHOW, EXPLAIN) on a read-only connection without "
               "file access; 5 s and 512 MB at most. Tables: runs, rounds, and the view run_stats.")
    _examples()
    sql = st.text_area("query", key="sql", bind="query-params", height=160,
                       placeholder="SELECT draft, k, avg(alpha) FROM run_stats GROUP BY ALL")
    # The URL may carry a query: it fills the editor but runs only on a click.
    if st.button("Run", key="run_sql", type="primary", icon=":material/play_arrow:"):
        _run(sql or "")
    if "sql_result" in st.session_state:
        _result(st.session_state["sql_result"])
    _schema()


if __name__ == "__main__":  # st.navigation runs each page file as __main__
    render()
