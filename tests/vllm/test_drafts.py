"""Which drafts vLLM runs and the exact speculative config each cell maps to; the ones it cannot run refused in one
line naming the engine, before anything runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from runner.engine.drafters.spec import PLAIN
from runner.vllm.drafts import VllmRefusal, eagle_method, parse, speculative_config
from runner.vllm.head_ids import for_vllm

ROOT = Path(__file__).resolve().parents[2]
HEAD = ROOT / "heads" / "smollm2-135m"


def test_each_draft_maps_to_its_vllm_method():
    assert speculative_config(PLAIN, None) is None
    assert speculative_config(parse("ngram"), 4) == {"method": "ngram", "num_speculative_tokens": 4,
                                                     "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    assert speculative_config(parse("ngram:5:earliest"), 2)["prompt_lookup_max"] == 5
    assert speculative_config(parse("model:smollm2-135m"), 3, lambda spec: f"/dir/{spec}") == {
        "method": "draft_model", "model": "/dir/smollm2-135m", "num_speculative_tokens": 3}
    # the shipped head's layer ids name layer outputs: vLLM gets the copy that states them as layer inputs
    assert speculative_config(parse(f"eagle:{HEAD}"), 4) == {"method": "eagle3", "model": str(for_vllm(HEAD)),
                                                             "num_speculative_tokens": 4}
    assert speculative_config(parse("medusa:/m"), 2) == {"method": "medusa", "model": "/m",
                                                         "num_speculative_tokens": 2}
    assert speculative_config(parse("vllm:suffix"), 8) == {"method": "suffix", "num_speculative_tokens": 8}
    assert speculative_config(parse('vllm:mtp:{"model": "/x"}'), 1) == {"method": "mtp", "num_speculative_tokens": 1,
                                                                        "model": "/x"}


def test_an_eagle_head_is_eagle3_by_its_config(tmp_path):
    assert eagle_method(HEAD) == "eagle3"  # the shipped head: LlamaForCausalLMEagle3, draft vocabulary 8,192
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    assert eagle_method(tmp_path) == "eagle"


@pytest.mark.parametrize("draft", ["ngram-tree", "recycling", "lookahead", "hybrid:h", "layerskip:8",
                                   "eagle-tree:h", "ngram:3:latest", "vllm:", "vllm:suffix:[1]"])
def test_a_draft_vllm_cannot_run_is_refused(draft):
    with pytest.raises(VllmRefusal):
        parse(draft)


def test_the_cli_refuses_before_anything_runs(tmp_path):
    db = tmp_path / "runs.duckdb"
    done = subprocess.run([sys.executable, "-m", "runner", "sweep", "--engine", "vllm", "--draft", "ngram",
                           "--draft", "recycling", "--k", "4", "--db", str(db)], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        'error: draft "recycling" cannot run on vLLM: it has no recycling method (vLLM drafts chains: ngram, '
        'model:<spec>, eagle:<head>, medusa:<head>, or vllm:<method>[:<json>])']
    assert not db.exists()
