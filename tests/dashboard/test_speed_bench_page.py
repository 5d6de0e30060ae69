"""The Spec-Bench · SPEED-Bench page on hand-made runs: SPEED-Bench's matrix shows the hand-computed values, the
input-length chart carries the throughput splits, and each section says what data it needs when the sweep has
none."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pandas as pd
import pyarrow as pa
import pytest
from streamlit.testing.v1 import AppTest

from runner.store.runs import write_run
from tests.store.test_speed_bench_report import RUNS, copied_as_vllm, plain, rounds, run

APP = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"


def page(db: Path, monkeypatch: pytest.MonkeyPatch, **params: str) -> AppTest:
    monkeypatch.setenv("SPECDASH_DB", str(db))
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.run()
    at.switch_page("spec_bench_page.py")
    at.query_params.update(params)
    at.run()
    assert not at.exception
    return at


def frame_with(at: AppTest, column: str) -> pd.DataFrame:
    return next(d.value for d in at.dataframe if column in d.value.columns)


def chart_rows(at: AppTest, title: str) -> pd.DataFrame:
    """The rows of the chart whose spec names `title`, as Streamlit ships them beside the spec."""
    (chart,) = [c for c in at.get("vega_lite_chart") if title in json.dumps(json.loads(c.proto.spec))]
    (dataset,) = chart.proto.datasets
    return pa.ipc.open_stream(dataset.data.data).read_pandas()


def test_the_matrix_shows_the_hand_computed_values(tmp_path, monkeypatch):
    db = tmp_path / "runs.duckdb"
    for record in RUNS:
        write_run(db, record)
    at = page(db, monkeypatch, spec_sweep="s")
    tau = frame_with(at, "coding").set_index("method")
    assert tau.loc["ngram k=3"].tolist() == ["2.80", "3.67", "3.12"]  # coding, summarization, all: 1 + 9/5, 1 + 8/3
    assert tau.loc["layerskip:2 k=2"].tolist() == ["2.00", "–", "2.00"]
    by_position = frame_with(at, "pos 1").set_index(["method", "category"])
    assert by_position.loc[("ngram k=3", "coding"), ["pos 1", "pos 2", "pos 3"]].tolist() == [0.8, 0.6, 0.4]
    rows = chart_rows(at, "input length")
    speedups = rows[rows["panel"].str.startswith("speedup")].set_index("bucket")["value"]
    assert speedups.to_dict() == pytest.approx({"1k": 2.5, "2k": 1.5})
    at.radio(key="speed_metric").set_value("alpha").run()
    alpha = frame_with(at, "coding").set_index("method")
    assert alpha.loc["ngram k=3", "all"] == f"{17 / 21:.2f}"


def test_each_section_says_what_it_needs(tmp_path, monkeypatch):
    db = tmp_path / "runs.duckdb"
    write_run(db, plain("code-01", "code", 4, 2.0))
    write_run(db, run("n-c", "code-01", "code", rounds(3, [3]), 1.0))
    at = page(db, monkeypatch)
    notes = [i.value for i in at.info]
    assert any("None of this sweep's categories (code) is one of Spec-Bench's" in n for n in notes)
    assert any(n.startswith("This sweep ran no SPEED-Bench prompt") for n in notes)


def test_each_other_engine_s_newest_speed_bench_sweep_is_shown_beside(tmp_path, monkeypatch):
    db = tmp_path / "runs.duckdb"
    for record in RUNS:
        write_run(db, record)
    with duckdb.connect(str(db)) as con:
        copied_as_vllm(con, "v", "13:00")
    at = page(db, monkeypatch, spec_sweep="s")
    assert [h.value for h in at.subheader if "by category" in h.value] == [
        "specdash: τ by category (qualitative split)", "vllm: τ by category (qualitative split)"]
    assert any("Beside this sweep, each other engine's newest: v." in c.value for c in at.caption)
