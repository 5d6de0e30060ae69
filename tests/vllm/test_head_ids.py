"""The shipped EAGLE-3 head given to vLLM with its target layers in vLLM's convention."""

from __future__ import annotations

import json
from pathlib import Path

from runner.vllm.head_ids import for_vllm, vllm_ids

HEAD = Path(__file__).resolve().parents[2] / "heads" / "smollm2-135m"


def test_ids_that_name_layer_outputs_become_layer_inputs():
    shipped = json.loads((HEAD / "config.json").read_text())
    assert shipped["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 14, 26]  # outputs of layers 1, 14, 26
    assert vllm_ids(shipped) == [2, 15, 27]  # the inputs of layers 2, 15, 27: vLLM's indices
    assert vllm_ids({**shipped, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 15, 27]}}) is None
    assert vllm_ids({key: value for key, value in shipped.items() if key != "eagle_config"}) is None


def test_vllm_gets_a_copy_with_its_ids_and_the_same_weights(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDASH_CACHE", str(tmp_path))
    copy = for_vllm(HEAD)
    assert copy.parent == tmp_path / "vllm-heads"
    config = json.loads((copy / "config.json").read_text())
    assert (config["eagle_aux_hidden_state_layer_ids"], config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]) \
        == ([2, 15, 27], [2, 15, 27])
    assert (copy / "model.safetensors").resolve() == (HEAD / "model.safetensors").resolve()
    assert for_vllm(copy) == copy and for_vllm(HEAD) == copy  # made once; a copy needs no copy of its own
