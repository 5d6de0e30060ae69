"""vLLM run here: one process of vLLM's own environment (`.venv-vllm`) that keeps vLLM imported for a whole sweep
and holds one offline engine (`vllm.LLM`) at a time, one per speculative config. Started by `runner/vllm/process.py`.

It imports nothing of specdash (it runs in an environment that does not have it). It reads one JSON command per stdin
line and writes one JSON reply per stdout line; everything else the process prints goes to stderr (the log):
- `{"load": {"model": dir, "dtype": ..., "max_model_len": n, "seed": s, "eager": bool, "speculative_config": {...}
  or null}}` drops the engine it holds, makes the new one and replies `{"version": vLLM's version}`;
- `{"generate": {"prompts": [[ids], ...], "max_tokens": n, "sampling": [{temperature, top_p[, seed]}, ...]}}`
  decodes the prompts together, each with its sampling (vLLM schedules them into the same steps), and replies
  `{"replies": [...]}`, each in the shape of a `/v1/completions` response of vLLM's server: `choices[0]` with
  `token_ids` and `finish_reason`, and `metrics` built by the server's own functions, so one reader serves both;
- a command that fails replies `{"error": its one line}`.
"""

from __future__ import annotations

import gc
import json
import os
import sys


def main() -> None:
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # vLLM's log lines (and anything C prints) go to the log, not among the replies
    from vllm import LLM, SamplingParams, __version__
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
    from vllm.entrypoints.generate.base.serving import build_per_request_timing_metrics, build_spec_decoding_metrics
    from vllm.inputs import TokensPrompt

    llm = None
    for line in sys.stdin:
        command = json.loads(line)
        try:
            if "load" in command:
                if llm is not None:
                    del llm
                    llm = None
                    gc.collect()
                    cleanup_dist_env_and_memory()
                spec = command["load"]
                config = spec["speculative_config"]
                # the model run in this process: no second process to import vLLM again
                llm = LLM(model=spec["model"], dtype=spec["dtype"], max_model_len=spec["max_model_len"],
                          seed=spec["seed"], enforce_eager=spec["eager"], distributed_executor_backend="uni",
                          disable_log_stats=False, speculative_config=config,
                          **({"per_request_spec_decode_metrics": "detailed"} if config else {}))
                reply = {"version": __version__}
            else:
                request = command["generate"]
                # as vLLM's server does: the model's generation config under what the request states
                defaults = llm.llm_engine.model_config.get_diff_sampling_param()
                params = [SamplingParams(**{**defaults, **sampling, "max_tokens": request["max_tokens"],
                                            "ignore_eos": False, "skip_special_tokens": False})
                          for sampling in request["sampling"]]
                outputs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in request["prompts"]], params,
                                       use_tqdm=False)
                reply = {"replies": [response(out, build_per_request_timing_metrics, build_spec_decoding_metrics)
                                     for out in outputs]}
        except Exception as exc:  # noqa: BLE001 - any refusal of vLLM's is the command's one-line answer
            reply = {"error": f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


def response(out, timing, spec) -> dict:
    """One finished request as vLLM's server answers it."""
    choice = out.outputs[0]
    metrics = timing(out.metrics, len(choice.token_ids))
    metrics.speculative_decoding = spec(out)
    return {"choices": [{"token_ids": list(choice.token_ids), "finish_reason": choice.finish_reason}],
            "metrics": metrics.model_dump(mode="json")}


if __name__ == "__main__":
    main()
