"""vLLM's offline engine as a peer for `bench/peers.py`, run by the Python of vLLM's own environment (`.venv-vllm`).

`python bench/vllm_peer.py MODEL_DIR plain|ngram|eagle3:HEAD_DIR THREADS MAX_MODEL_LEN` loads one `vllm.LLM` (float32,
greedy; ngram: prompt lookup with 4 speculative tokens, n-grams of 3 down to 1; eagle3: the head at HEAD_DIR drafting
4), then answers one JSON request per stdin line,
`{"prompt": [ids], "max_new_tokens": n}`, with one stdout line `@@peer {"tokens": [ids], "seconds": s}`: the whole
request's wall time, prefill included, as the bench times ours. vLLM's own log lines never start with the marker.
It imports nothing of specdash: it runs in an environment that does not have it.
"""

from __future__ import annotations

import json
import os
import sys
import time

MARKER = "@@peer "
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


def serve(model_dir: str, mode: str, threads: int, max_model_len: int) -> None:
    # vLLM's CPU workers bind their OpenMP threads to this list: the same thread count as the engines beside it.
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(str(c) for c in sorted(os.sched_getaffinity(0))[:threads])
    # Its n-gram matcher's numba pool too (else a thread per core, beside the bound ones: runner/vllm/server.py).
    os.environ["NUMBA_NUM_THREADS"] = str(threads)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    head = {"method": "eagle3", "model": mode.removeprefix("eagle3:"), "num_speculative_tokens": 4}
    config = {"plain": None, "ngram": NGRAM}.get(mode, head)
    llm = LLM(model=model_dir, dtype="float32", max_model_len=max_model_len, seed=0, speculative_config=config)
    print(MARKER + json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        params = SamplingParams(temperature=0.0, max_tokens=request["max_new_tokens"])
        start = time.perf_counter()
        [out] = llm.generate([TokensPrompt(prompt_token_ids=request["prompt"])], params, use_tqdm=False)
        seconds = time.perf_counter() - start
        print(MARKER + json.dumps({"tokens": list(out.outputs[0].token_ids), "seconds": seconds}), flush=True)


if __name__ == "__main__":  # vLLM spawns its engine process, which imports this file again
    if len(sys.argv) != 5 or not (sys.argv[2] in ("plain", "ngram") or sys.argv[2].startswith("eagle3:")):
        print("usage: vllm_peer.py MODEL_DIR plain|ngram|eagle3:HEAD_DIR THREADS MAX_MODEL_LEN", file=sys.stderr)
        sys.exit(2)
    serve(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
