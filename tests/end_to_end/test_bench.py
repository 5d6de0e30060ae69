"""`make bench` (bench/bench.py): a quick run end to end, and the table's arithmetic by hand."""

from __future__ import annotations

import contextlib
import io
import math
from pathlib import Path

import duckdb
import pytest
import torch

from bench import bench, passes, rows, tables
from bench.batched import theirs
from bench.side_by_side import GREEDY, PLAIN_CELL, BenchConfig, Cell, Engines, Sample
from runner.engine.drafters.registry import parse_draft
from runner.engine.drafters.spec import PLAIN
from runner.engine.round.policies import parse_policy
from runner.engine.weights.kernels import all_cores
from runner.prompts import Prompt
from runner.store.bench_rows import BENCH_COLUMNS, bench_results, goal_for


def test_rows_hold_medians_and_min_max_over_repeats_and_judge_the_goal():
    row = rows.Row("spec_tokens_per_s", "ngram", 4, "all", [10.0, 12.0, 11.0], [8.0, 10.0, 10.0], mismatches=0)
    assert row.ratios == [1.25, 1.2, 1.1]
    assert row.goal() == ("ratio >= 1.15", True)  # the median ratio, 1.2
    [record] = rows.db_rows([row], {"bench_id": "b1"})
    assert (record["ours"], record["ours_min"], record["ours_max"]) == (11.0, 10.0, 12.0)
    assert (record["theirs"], record["theirs_min"], record["theirs_max"]) == (10.0, 8.0, 10.0)
    assert (record["ratio"], record["ratio_min"], record["ratio_max"]) == (1.2, 1.1, 1.25)
    assert tables.format_line(record) == (
        "| spec_tokens_per_s | ngram | 4 | fixed | all | 11.00 (10.00–12.00) | 10.00 (8.00–10.00) | 1.20 (1.10–1.25) "
        "|  |  | ratio >= 1.15: met | 0 |")
    share = rows.Row("overhead_share", "ngram", 4, "all", [0.04, 0.07, 0.06])
    assert share.ratios is None and share.goal() == ("ours <= 0.05", False)  # median 0.06
    assert "6.00% (4.00%–7.00%) | — | — |" in tables.format_line(rows.db_rows([share], {})[0])


@pytest.fixture(scope="module")
def quick(tiny_dir, tmp_path_factory) -> tuple[int, str, list[dict]]:
    """One --quick bench on a tiny random model (SmolLM2's tokenizer): every path, in seconds. The bench measures the
    kernels' choices afresh and caches them; in a cache of its own, so that a sweep of the same tiny model in another
    test process never reads a table written halfway through its run (a Ray actor and the local sweep it is compared
    with then round a probability differently in its last bit)."""
    db = tmp_path_factory.mktemp("bench") / "runs.duckdb"
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECDASH_CACHE", str(tmp_path_factory.mktemp("bench-cache")))
        code = bench.main(["--quick", "--target", str(tiny_dir), "--drafts", "ngram,layerskip:2", "--db", str(db)])
    printed = out.getvalue()
    bench_id = printed.rsplit("recorded as bench ", 1)[1].split()[0]
    assert len(bench_results(db, bench_id)) > 0
    con = duckdb.connect(str(db), read_only=True)
    try:
        rows = con.execute(f"SELECT {', '.join(BENCH_COLUMNS)} FROM bench_results WHERE bench_id = ? "
                           "ORDER BY rowid", [bench_id]).fetchall()
    finally:
        con.close()
    return code, printed, [dict(zip(BENCH_COLUMNS, row, strict=True)) for row in rows]


def formula(alpha: float, k: int, c: float) -> float:
    """Leviathan et al., written out here so the test does not trust the code under test."""
    return (k + 1) / (1 + k * c) if alpha == 1 else (1 - alpha ** (k + 1)) / ((1 - alpha) * (1 + k * c))


def undefined(value: float | None) -> bool:
    return value is None or math.isnan(value)


def of(rows: list[dict], metric: str) -> list[dict]:
    return [r for r in rows if r["metric"] == metric]


def test_quick_bench_has_a_row_for_every_draft_and_k_with_lossless_outputs(quick):
    code, printed, rows = quick
    assert code == 0
    assert [(r["draft"], r["k"], r["category"]) for r in of(rows, "spec_tokens_per_s")] == [
        ("ngram", 2, "all"), ("ngram", 2, "code"), ("layerskip:2", 2, "all"), ("layerskip:2", 2, "code")]
    assert [(r["draft"], r["k"], r["category"]) for r in of(rows, "plain_tokens_per_s")] == [
        ("none", 0, "all"), ("none", 0, "code")]
    # Equal to greedy: ours and transformers' plain outputs agree, and each engine's speculative output
    # equals its own plain output.
    throughput = of(rows, "plain_tokens_per_s") + of(rows, "spec_tokens_per_s")
    assert [r["mismatches"] for r in throughput] == [0] * 6
    assert "lossless: every output equal to its engine's plain greedy output" in printed
    for r in throughput:
        assert r["ours"] > 0 and r["theirs"] > 0 and math.isfinite(r["ratio"]) and r["ratio"] > 0
        assert r["ratio"] == pytest.approx(r["ours"] / r["theirs"])  # one repeat: the ratio of the values
        assert (r["repeats"], r["prompts"], r["max_new_tokens"]) == (1, 1, 8)
        assert r["goal"] == ("ratio >= 1.1" if r["metric"] == "plain_tokens_per_s" else None)  # goals: ngram k=4
        assert (r["threads"], r["kernels"]) == (all_cores(), "skinny")


def test_quick_bench_decodes_batches_with_ours_against_transformers_batched_generate(quick):
    _, _, rows = quick
    batch = of(rows, "batch_tokens_per_s")
    assert [(r["draft"], r["k"], r["category"]) for r in batch] == [
        ("none", 0, "batch=4"), ("ngram", 2, "batch=4"), ("layerskip:2", 2, "batch=4")]
    # one prompt reused four times; every sequence equal to ours decoded alone
    assert [r["mismatches"] for r in batch] == [0, 0, 0]
    assert len({r["theirs"] for r in batch}) == 1  # one counterpart: transformers' plain batched generate
    for r in batch:
        assert r["ours"] > 0 and r["ratio"] == pytest.approx(r["ours"] / r["theirs"])
    assert [r["goal"] for r in batch] == ["ratio >= 1.1", None, None]


def test_transformers_batched_generate_left_pads_and_stops_each_row_at_its_end(tiny):
    config = BenchConfig(target="x", drafts=(), ks=(2,), policies=(), policy_k=2, prompts=(), max_new_tokens=6,
                         repeats=1, verify_repeats=1, verify_context=8, warmup_tokens=2, db=Path("unused"),
                         device=None, dtype=None, threads=1, kernels="stock", command="")
    engines = Engines(config, tiny)
    try:
        prompts = [[5, 9, 14, 5, 9], [301, 7]]
        alone = [engines.pair.run(PLAIN, p, None, GREEDY, 6, 0).output_tokens for p in prompts]
        assert theirs(engines, prompts, 6) == alone
    finally:
        engines.close()


def test_quick_bench_overheads_speedups_and_verify_curve_are_sane(quick):
    _, _, rows = quick
    for metric in ("overhead_share", "loop_overhead_share", "record_share", "record_ms"):
        assert [r["draft"] for r in of(rows, metric)] == ["ngram", "layerskip:2"]
    for metric in ("overhead_share", "loop_overhead_share"):
        assert all(0 <= r["ours"] < 1 for r in of(rows, metric)), metric
    assert all(0 <= r["theirs"] < 1 for r in of(rows, "overhead_share"))
    # Writing a run costs something (on a tiny model, more than the run itself).
    assert all(0 < r["ours"] for r in of(rows, "record_share") + of(rows, "record_ms"))
    for r in of(rows, "speedup"):
        assert r["ours"] > 0
        if undefined(r["alpha"]):  # prompt lookup found nothing to draft: nothing judged, so no α and no prediction
            assert r["draft"] == "ngram" and undefined(r["theirs"])
            continue
        assert 0 <= r["alpha"] <= 1 and r["c"] >= 0
        # one prompt, one repeat: the formula at that run's own α and c
        assert r["theirs"] == pytest.approx(formula(r["alpha"], r["k"], r["c"]))
    # Prompt lookup calls no draft model; the layer-skip draft runs k=2 forwards a round in both engines.
    assert [(r["draft"], r["k"]) for r in of(rows, "target_passes")] == [("none", 0), ("ngram", 2), ("layerskip:2", 2)]
    assert [(r["draft"], r["k"]) for r in of(rows, "draft_passes")] == [("layerskip:2", 2)]
    plain = of(rows, "target_passes")[0]
    assert (plain["ours"], plain["theirs"]) == (8, 8)  # 8 tokens: the prefill makes the first, then one pass each
    threads = sorted({1, all_cores()})
    passes_of = [(shape, width - 1) for shape, widths in passes.WIDTHS.items() for width in widths]
    assert passes.WIDTHS["chain"][-1] == passes.WIDTHS["tree"][-1] == 64 and passes.WIDTHS["batch"][-1] == 60
    for metric in ("verify_ms", "verify_ms_stock"):
        verify = of(rows, metric)
        assert sorted((r["draft"], r["k"], r["category"], r["threads"]) for r in verify) == sorted(
            (shape, k, f"threads={n}", n) for n in threads for shape, k in passes_of)
        assert all(r["ours"] > 0 for r in verify)
        for n in threads:
            curve = [r for r in verify if r["threads"] == n]
            [one_token] = [r for r in curve if (r["draft"], r["k"]) == ("chain", 0)]
            assert one_token["ratio"] == 1.0 and {r["theirs"] for r in curve} == {one_token["ours"]}
            for r in curve:  # on our kernels: by the rows of the pass at the bench's threads, 16 rows at one thread
                rows_in_pass = r["k"] + 1
                expected = (None if metric != "verify_ms" or rows_in_pass == 1 else
                            next(f"ratio <= {b:g}" for top, b in ((5, 1.1), (16, 1.35), (32, 1.8), (64, 3))
                                 if rows_in_pass <= top) if n == all_cores() else
                            "ratio <= 1.5" if rows_in_pass == 16 else None)
                assert r["goal"] == expected, (metric, r["draft"], r["k"], n)
    # Ours over stock, pass by pass: the same medians as the two curves' (the ratio is per repeat).
    skinny = {(r["draft"], r["k"], r["threads"]): r["ours"] for r in of(rows, "verify_ms")}
    stock = {(r["draft"], r["k"], r["threads"]): r["ours"] for r in of(rows, "verify_ms_stock")}
    against = of(rows, "verify_vs_stock")
    assert len(against) == len(skinny)
    for r in against:
        key = (r["draft"], r["k"], r["threads"])
        assert (r["ours"], r["theirs"]) == (skinny[key], stock[key])
        assert r["goal"] == ("ratio <= 1" if r["threads"] == all_cores() else None)


def test_quick_bench_roofline_is_the_weight_bytes_over_the_one_token_pass_against_the_copy(quick, tiny):
    _, _, rows = quick
    assert passes.weight_bytes(tiny.model) == 4 * (49152 * 64 + 4 * (64 * 64 * 2 + 32 * 64 * 2 + 128 * 64 * 3 + 2 * 64)
                                                   + 64)  # tied head: the embedding table counted once
    for metric, verify in (("roofline", "verify_ms"), ("roofline_stock", "verify_ms_stock")):
        rooflines = of(rows, metric)
        assert [r["threads"] for r in rooflines] == sorted({1, all_cores()})  # each against a copy at its threads
        for roofline in rooflines:
            [one_token] = [r for r in of(rows, verify)
                           if (r["draft"], r["k"], r["threads"]) == ("chain", 0, roofline["threads"])]
            # The median of bytes / time over 3 repeats is bytes / the median time. The tiny model may sit in cache,
            # so no bound on the share here; the ratio is the median of the per-repeat ratios.
            assert roofline["repeats"] == one_token["repeats"] == 3
            assert roofline["ours"] == pytest.approx(
                passes.weight_bytes(tiny.model) / (one_token["ours"] / 1000) / 1e9)
            assert roofline["theirs"] > 0 and roofline["ratio_min"] <= roofline["ratio"] <= roofline["ratio_max"]
            judged = metric == "roofline" and roofline["threads"] == all_cores()
            assert roofline["goal"] == ("ratio >= 0.8" if judged else None)


def test_the_goals_are_the_ones_set_for_each_metric_draft_k_and_category():
    assert goal_for("plain_tokens_per_s", "none", None, "code").text == "ratio >= 1.1"
    assert goal_for("spec_tokens_per_s", "ngram", 4, "summary").text == "ratio >= 1.3"
    assert goal_for("spec_tokens_per_s", "ngram", 4, "all").text == "ratio >= 1.15"
    assert goal_for("spec_tokens_per_s", "ngram", 4, "code") is None
    assert goal_for("spec_tokens_per_s", "ngram", 2, "all") is None
    assert goal_for("spec_tokens_per_s", "layerskip:24", 4, "all") is None
    # The verify pass by its rows (k + 1), whatever its shape: <= 5, <= 16, <= 32, <= 64.
    assert goal_for("verify_ms", "chain", 0, "threads=2") is None and goal_for("verify_ms", "chain", 64, "x") is None
    assert [goal_for("verify_ms", "tree", k, "threads=2").bound for k in (1, 4, 5, 15, 16, 31, 32, 63)] == [
        1.1, 1.1, 1.35, 1.35, 1.8, 1.8, 3.0, 3.0]
    assert goal_for("verify_ms", "batch", 15, "threads=1").text == "ratio <= 1.35"  # a one-thread bench: the stricter
    # A row shown beside the bench's threads is held only to a one-thread goal.
    assert goal_for("verify_ms", "chain", 15, "threads=1", judged=False).text == "ratio <= 1.5"
    assert goal_for("verify_ms", "chain", 16, "threads=1", judged=False) is None
    assert goal_for("overhead_share", "ngram", 4, "all").text == "ours <= 0.05"
    assert goal_for("roofline", "none", 0, "threads=2").text == "ratio >= 0.8"
    assert goal_for("verify_vs_stock", "batch", 39, "threads=2").text == "ratio <= 1"
    # A row shown for comparison is not judged.
    assert rows.Row("verify_ms", "chain", 2, "threads=1", [12.0], [10.0], judged=False).goal() == (None, None)
    assert rows.Row("verify_ms", "chain", 2, "threads=2", [10.5], [10.0]).goal() == ("ratio <= 1.1", True)
    assert rows.Row("verify_ms", "chain", 15, "threads=1", [16.0], [10.0], judged=False).goal() == (
        "ratio <= 1.5", False)


def test_quick_bench_times_each_policy_against_transformers_adaptive_counterpart(quick):
    _, _, rows = quick
    adaptive = [(r["metric"], r["draft"], r["k"], r["k_policy"]) for r in rows
                if r["metric"] in ("adaptive_tokens_per_s", "early_exit_tokens_per_s") and r["category"] == "all"]
    # Prompt lookup has no confidence to stop on; a layer-skip draft meets transformers' assistant and early exit.
    best = [a[3] for a in adaptive if a[3].startswith("best: ")]
    assert adaptive == [
        ("adaptive_tokens_per_s", "ngram", 2, "heuristic"), ("adaptive_tokens_per_s", "ngram", 2, "auto"),
        ("adaptive_tokens_per_s", "layerskip:2", 2, "heuristic"), ("adaptive_tokens_per_s", "layerskip:2", 2, "auto"),
        ("adaptive_tokens_per_s", "layerskip:2", 2, "confidence:0.4"),
        ("adaptive_tokens_per_s", "ngram", 2, best[0]), ("adaptive_tokens_per_s", "layerskip:2", 2, best[1]),
        ("early_exit_tokens_per_s", "layerskip:2", 2, "heuristic"),
        ("early_exit_tokens_per_s", "layerskip:2", 2, "auto"),
        ("early_exit_tokens_per_s", "layerskip:2", 2, "confidence:0.4"),
        ("early_exit_tokens_per_s", "layerskip:2", 2, best[2])]
    by = {(r["metric"], r["draft"], r["k_policy"], r["category"]): r for r in rows}
    for category in ("all", "code"):
        # Prompt lookup's counterpart is transformers' best fixed k: the bench's only k here, 2.
        for policy in ("heuristic", "auto"):
            assert by["adaptive_tokens_per_s", "ngram", policy, category]["theirs"] == \
                by["spec_tokens_per_s", "ngram", "fixed", category]["theirs"]
        for metric in ("adaptive_tokens_per_s", "early_exit_tokens_per_s"):
            ours = [by[metric, "layerskip:2", p, category] for p in ("heuristic", "auto", "confidence:0.4")]
            assert len({r["theirs"] for r in ours}) == 1  # one transformers run, three of our policies
            best_row = next(r for r in rows if r["k_policy"].startswith("best: ")
                            and (r["metric"], r["draft"], r["category"]) == (metric, "layerskip:2", category))
            top = max(ours, key=lambda r: r["ours"])
            assert (best_row["k_policy"], best_row["ours"], best_row["ratio"]) == (
                f"best: {top['k_policy']}", top["ours"], top["ratio"])
    judged = [(r["metric"], r["draft"], r["k_policy"].split(":")[0], r["category"], r["goal"]) for r in rows
              if r["metric"] in ("adaptive_tokens_per_s", "early_exit_tokens_per_s") and r["goal"]]
    assert judged == [("adaptive_tokens_per_s", "ngram", "best", "all", "ratio >= 1.15"),
                      ("adaptive_tokens_per_s", "layerskip:2", "best", "all", "ratio >= 1.15"),
                      ("early_exit_tokens_per_s", "layerskip:2", "best", "all", "ratio >= 1.15")]
    # Every adaptive output, ours and transformers' (early exit included), equals its engine's plain greedy output.
    assert {r["mismatches"] for r in rows if r["metric"].endswith("_tokens_per_s")} == {0}


def _sample(cell: Cell, engine: str, repeat: int, prompt: Prompt, tokens: int, wall_s: float) -> Sample:
    return Sample(cell, engine, repeat, prompt, (7,) * tokens, wall_s, 0.0, 0.0, 0, 0)


def test_prompt_lookups_counterpart_is_transformers_best_fixed_k_per_category_by_its_median():
    code, poem = Prompt("code-01", "code", "x"), Prompt("poem-01", "poem", "x")
    ngram = parse_draft("ngram")
    k2, k4, adaptive = Cell(ngram, 2), Cell(ngram, 4), Cell(ngram, 4, parse_policy("heuristic"))
    # transformers' seconds for 10 tokens, per (cell, prompt) and repeat: k=4 is its best on code, k=2 on poems.
    theirs = {(k2, code): (1.0, 1.0, 1.0), (k4, code): (0.5, 2.0, 0.4), (k2, poem): (0.5, 0.5, 0.5),
              (k4, poem): (1.0, 1.0, 1.0)}
    samples = [_sample(cell, "theirs", r, prompt, 10, wall) for (cell, prompt), walls in theirs.items()
               for r, wall in enumerate(walls)]
    samples += [_sample(adaptive, "ours", r, prompt, 10, 0.25) for prompt in (code, poem) for r in range(3)]
    samples += [_sample(PLAIN_CELL, engine, 0, prompt, 10, 1.0) for prompt in (code, poem)
                for engine in ("ours", "theirs")]
    reference = {(engine, p.id): (7,) * 10 for p in (code, poem) for engine in ("ours", "theirs")}
    got = {(r.k_policy, r.category): r for r in rows.adaptive_rows(samples, [PLAIN_CELL, k2, k4, adaptive], reference)}
    # ours: 10 tokens in 0.25 s = 40 tokens/s every repeat. code: k=4 gives 20, 5, 25 (median 20) against k=2's 10.
    assert got["heuristic", "code"].theirs == [20.0, 5.0, 25.0] and got["heuristic", "code"].ratios == [2.0, 8.0, 1.6]
    assert got["heuristic", "poem"].theirs == [20.0, 20.0, 20.0]  # k=2: 20 tokens/s against k=4's 10
    # all: 20 tokens over both prompts' seconds: k=2 1.5 s each repeat (13.3/s); k=4 1.5, 3.0, 1.4 s: median 13.3/s
    assert got["heuristic", "all"].theirs == pytest.approx([20 / 1.5, 20 / 1.5, 20 / 1.5])
    assert got["best: heuristic", "code"].goal() == (None, None)  # judged on all prompts only
    assert got["best: heuristic", "all"].goal() == ("ratio >= 1.15", True)
    assert got["heuristic", "all"].goal() == (None, None)  # one policy's row is shown, the best is judged
    assert got["heuristic", "all"].mismatches == 0


def test_what_is_printed_is_what_is_stored(quick):
    _, printed, rows = quick
    table_lines = [line for line in printed.splitlines() if line.startswith("| ") and "| metric |" not in line]
    # plain + spec, adaptive (per policy, then best), passes, overheads, speedups, batches (plain and each draft),
    # verify curves, rooflines
    passes_per_curve = sum(len(widths) for widths in passes.WIDTHS.values())
    assert len(rows) == 2 + 4 + (4 + 12) + 6 + (3 + 1) + 4 * 2 + 4 + 3 + 3 * passes_per_curve * len({1, all_cores()}) \
        + 2 * len({1, all_cores()})
    assert [tables.format_line(r) for r in rows] == table_lines


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_device_cuda_without_cuda_fails_in_one_line(tmp_path, capsys):
    assert bench.main(["--quick", "--device", "cuda", "--db", str(tmp_path / "runs.duckdb")]) == 2
    err = capsys.readouterr().err
    assert err == "bench: error: --device cuda asked for, but no CUDA device is available\n"
    assert not (tmp_path / "runs.duckdb").exists()


def test_the_bench_leaves_the_models_it_timed_as_it_found_them(tiny):
    config = BenchConfig(target="x", drafts=("layerskip:2",), ks=(2,), policies=(), policy_k=2, prompts=(),
                         max_new_tokens=6, repeats=1, verify_repeats=1, verify_context=8, warmup_tokens=2,
                         db=Path("unused"), device=None, dtype=None, threads=1, kernels="stock", command="")
    engines = Engines(config, tiny)
    assert "forward" in vars(tiny.model)  # timed while the bench runs
    engines.close()
    # A later layer-skip copy of the shared model would otherwise run the whole model through the old wrapper.
    assert "forward" not in vars(tiny.model)
    assert not engines.record_dir.name or not Path(engines.record_dir.name).exists()
