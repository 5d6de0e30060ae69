"""bench/peers.py's arithmetic and its command line, without loading vLLM: rates per repeat as Spec-Bench's
speed.py averages them, the ratios against each peer, the lookup speedups, and usage errors."""

from __future__ import annotations

import pytest

from bench import peers
from bench.limits import COPY, PRODUCT_JOB, interleaved, limits_from
from bench.peers import HEAD_MODE, LOOKUP_MODE, PLAIN_MODE, Sample


def _sample(engine: str, mode: str, prompt: int, repeat: int, tokens: int, seconds: float) -> Sample:
    return Sample(engine, mode, prompt, repeat, tuple(range(tokens)), seconds)


SAMPLES = [
    # repeat 0: ours plain 10 and 20 tokens/s (mean 15), lookup 30 and 30 (30); vLLM plain 12, 18 (15), lookup 15, 15
    _sample("ours", PLAIN_MODE, 0, 0, 10, 1.0), _sample("ours", PLAIN_MODE, 1, 0, 20, 1.0),
    _sample("ours", LOOKUP_MODE, 0, 0, 30, 1.0), _sample("ours", LOOKUP_MODE, 1, 0, 15, 0.5),
    _sample("vllm", PLAIN_MODE, 0, 0, 12, 1.0), _sample("vllm", PLAIN_MODE, 1, 0, 9, 0.5),
    _sample("vllm", LOOKUP_MODE, 0, 0, 15, 1.0), _sample("vllm", LOOKUP_MODE, 1, 0, 15, 1.0),
    # repeat 1: everything twice as slow
    _sample("ours", PLAIN_MODE, 0, 1, 10, 2.0), _sample("ours", PLAIN_MODE, 1, 1, 20, 2.0),
    _sample("ours", LOOKUP_MODE, 0, 1, 30, 2.0), _sample("ours", LOOKUP_MODE, 1, 1, 15, 1.0),
    _sample("vllm", PLAIN_MODE, 0, 1, 12, 2.0), _sample("vllm", PLAIN_MODE, 1, 1, 9, 1.0),
    _sample("vllm", LOOKUP_MODE, 0, 1, 15, 2.0), _sample("vllm", LOOKUP_MODE, 1, 1, 15, 2.0),
]


def test_rates_are_the_mean_over_prompts_per_repeat():
    assert peers.rates(SAMPLES, "ours", PLAIN_MODE) == [15.0, 7.5]
    assert peers.rates(SAMPLES, "vllm", LOOKUP_MODE) == [15.0, 7.5]


def test_rows_set_ours_against_the_peer_and_each_lookup_speedup_against_its_own_plain():
    plain, lookup, speedup = peers.throughput_rows(SAMPLES, ["vllm"], {"vllm/ngram": 1})
    assert (plain.metric, plain.draft, plain.k) == ("vllm_tokens_per_s", "none", None)
    assert plain.ratios == [1.0, 1.0] and plain.mismatches == 0
    assert (lookup.draft, lookup.k, lookup.ratios, lookup.mismatches) == ("ngram", 4, [2.0, 2.0], 1)
    # ours: 30 / 15 = 2.0; vLLM: 15 / 15 = 1.0
    assert speedup.metric == "lookup_speedup_vllm" and speedup.ours == [2.0, 2.0] and speedup.theirs == [1.0, 1.0]
    assert speedup.goal() == ("ratio >= 1", True)


def test_the_head_is_set_against_vllm_s_and_left_out_of_transformers():
    head = [  # ours 40 tokens/s with the head, vLLM 30; both plain as in SAMPLES' repeat 0 (15 each)
        _sample("ours", HEAD_MODE, 0, 0, 40, 1.0), _sample("ours", HEAD_MODE, 1, 0, 40, 1.0),
        _sample("vllm", HEAD_MODE, 0, 0, 30, 1.0), _sample("vllm", HEAD_MODE, 1, 0, 30, 1.0)]
    repeat0 = [s for s in SAMPLES if s.repeat == 0]
    rows = peers.throughput_rows(repeat0 + head, ["vllm"], {})
    assert [(r.metric, r.draft) for r in rows] == [
        ("vllm_tokens_per_s", "none"), ("vllm_tokens_per_s", "ngram"),
        ("vllm_tokens_per_s", "eagle:heads/smollm2-135m"), ("lookup_speedup_vllm", "ngram"),
        ("head_speedup_vllm", "eagle:heads/smollm2-135m")]
    assert rows[2].ratios == [40 / 30]
    assert (rows[4].ours, rows[4].theirs) == ([40 / 15], [30 / 15])
    hf = [Sample("transformers", s.mode, s.prompt, s.repeat, s.tokens, s.seconds)
          for s in repeat0 if s.engine == "vllm"]
    assert [r.metric for r in peers.throughput_rows(repeat0 + head + hf, ["transformers"], {})] == [
        "hf_tokens_per_s", "hf_tokens_per_s", "lookup_speedup_hf"]


@pytest.mark.parametrize("argv", [["--repeats", "0"], ["--vllm-python", "/no/such/python"]])
def test_bad_input_exits_2_with_one_line(argv, capsys):
    assert peers.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("peers: error: ")


def test_the_split_sets_our_prompt_pass_and_per_token_time_against_vllm_s():
    def plain(engine: str, prompt: int, repeat: int, tokens: int, split: tuple[float, float] | None) -> Sample:
        return Sample(engine, PLAIN_MODE, prompt, repeat, tuple(range(tokens)), 1.0, split)

    samples = [
        # repeat 0: ours 0.10 and 0.20 s to the first token (mean 150 ms), then 0.9 s for 9 tokens and 1.8 s for
        # 9 (100 and 200 ms each: 150); vLLM 0.08 and 0.12 s (100 ms), 0.9 s for 9 twice (100 ms)
        plain("ours", 0, 0, 10, (0.10, 0.9)), plain("ours", 1, 0, 10, (0.20, 1.8)),
        plain("vllm", 0, 0, 10, (0.08, 0.9)), plain("vllm", 1, 0, 10, (0.12, 0.9)),
        # repeat 1: one token each: a first token, no later ones
        plain("ours", 0, 1, 1, (0.30, 0.0)), plain("vllm", 0, 1, 1, (0.20, 0.0)),
        plain("transformers", 0, 0, 10, None),  # no split: never read
    ]
    prefill, decode = peers.split_rows(samples)
    assert (prefill.metric, prefill.draft, prefill.k) == ("prefill_ms_vllm", "none", None)
    assert prefill.ours == pytest.approx([150.0, 300.0]) and prefill.theirs == pytest.approx([100.0, 200.0])
    assert decode.metric == "decode_ms_vllm"
    assert decode.ours == pytest.approx([150.0]) and decode.theirs == pytest.approx([100.0])
    assert decode.ratios == pytest.approx([1.5])
    assert peers.split_rows([s for s in samples if s.engine != "vllm"]) == []


def test_accepted_drafts_set_ours_against_vllm_s_per_draft_and_repeat():
    def drafted(engine: str, mode: str, prompt: int, repeat: int, accepted: int) -> Sample:
        return Sample(engine, mode, prompt, repeat, tuple(range(32)), 1.0, None, accepted)

    samples = [
        # repeat 0, lookup: ours 4 and 9 accepted (mean 6.5), vLLM 4 and 9; the head: ours 10 and 20, vLLM 12 and 20
        drafted("ours", LOOKUP_MODE, 0, 0, 4), drafted("ours", LOOKUP_MODE, 1, 0, 9),
        drafted("vllm", LOOKUP_MODE, 0, 0, 4), drafted("vllm", LOOKUP_MODE, 1, 0, 9),
        drafted("ours", HEAD_MODE, 0, 0, 10), drafted("ours", HEAD_MODE, 1, 0, 20),
        drafted("vllm", HEAD_MODE, 0, 0, 12), drafted("vllm", HEAD_MODE, 1, 0, 20),
        # repeat 1, lookup only: ours 5 and 9 (7), vLLM 4 and 8 (6)
        drafted("ours", LOOKUP_MODE, 0, 1, 5), drafted("ours", LOOKUP_MODE, 1, 1, 9),
        drafted("vllm", LOOKUP_MODE, 0, 1, 4), drafted("vllm", LOOKUP_MODE, 1, 1, 8),
        drafted("ours", PLAIN_MODE, 0, 0, 0), drafted("vllm", PLAIN_MODE, 0, 0, 0),  # plain: no row
    ]
    lookup, head = peers.accepted_rows(samples)
    assert (lookup.metric, lookup.draft, lookup.k) == ("accepted_vllm", "ngram", 4)
    assert (lookup.ours, lookup.theirs) == ([6.5, 7.0], [6.5, 6.0])
    assert (head.draft, head.ours, head.theirs) == ("eagle:heads/smollm2-135m", [15.0], [16.0])
    assert peers.accepted_rows([s for s in samples if s.engine != "vllm"]) == []


def test_the_limits_are_timed_in_turn_with_the_passes_and_turned_into_rates():
    """The copy and the product take turns with the passes in every repeat (the order flipping), and their
    milliseconds become GB/s (512 MiB read and written) and GFLOP/s (2 x 2048^3)."""
    calls = []
    jobs = {name: (lambda name=name: calls.append(name)) for name in (1, 64, COPY, PRODUCT_JOB)}
    times = interleaved(jobs, repeats=2)
    assert calls == [PRODUCT_JOB, COPY, 64, 1, 1, 64, COPY, PRODUCT_JOB, PRODUCT_JOB, COPY, 64, 1]  # a warm-up first
    assert {name: len(ms) for name, ms in times.items()} == {1: 2, 64: 2, COPY: 2, PRODUCT_JOB: 2}
    limits = limits_from({COPY: [1000.0, 500.0], PRODUCT_JOB: [1000.0, 2000.0]})
    assert limits.copy_gbs == pytest.approx([2 * 512 * 2**20 / 1e9, 4 * 512 * 2**20 / 1e9])
    assert limits.product_gflops == pytest.approx([2 * 2048**3 / 1e9, 2048**3 / 1e9])
