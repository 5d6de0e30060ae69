"""vLLM run here, in its own environment (`make vllm-env`): one process (runner/vllm/worker.py) that imports vLLM
once and holds one offline engine at a time, made anew for each speculative config.

A start on this project's small CPUs is mostly imports (~15 s of one core for vLLM and torch), an engine 3-7 s more.
A `vllm serve` per config imported both twice per config (its engine core is a second process): a sweep of three
configs over two prompts took 52 s in one process against 131 s with a server per config (2-core AMD EPYC, one
thread). A sweep's engines are eager (`enforce_eager`: compiling would add minutes per config on a small CPU) and run
the model in the process (the `uni` executor); their timings are eager vLLM's, which is what a CPU deployment runs
unless it compiles. `bench/peers.py` lets vLLM compile, as a deployment would.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("worker.py")
ENV_TARGET = "make vllm-env"  # what builds the environment (the Makefile's target)


class VllmError(ValueError):
    """vLLM could not be reached or refused; the message is one line."""


def vllm_python() -> Path:
    """The interpreter of vLLM's environment: $SPECDASH_VLLM_PYTHON, else the project's .venv-vllm."""
    python = Path(os.environ.get("SPECDASH_VLLM_PYTHON", ROOT / ".venv-vllm" / "bin" / "python"))
    if not python.is_file():
        raise VllmError(f"no vLLM environment at {python.parent.parent}: build it with `{ENV_TARGET}`")
    return python


@dataclass(frozen=True)
class Settings:
    """How vLLM runs here; one per sweep, whatever its speculative configs."""

    model: str  # the directory (or cached repo id) vLLM loads
    threads: int = 1  # CPU cores its OpenMP threads are bound to (the first this process may run on)
    dtype: str = "float32"  # the target's dtype, as our engine runs it on CPU
    max_model_len: int = 2048  # the longest sequence it serves: prompt and new tokens (the engine sets it)
    kv_cache_gib: int = 1  # VLLM_CPU_KVCACHE_SPACE: a few requests of a 135M model need little
    start_timeout_s: float = 900.0  # a first start under load imports (or compiles) for minutes
    eager: bool = True  # False: vLLM compiles its graphs, as a deployment runs it (minutes for a first start)


def reusable(config: dict | None) -> bool:
    """Whether a process whose engine ran `config` can make the next engine. Not after prompt lookup: its matcher
    loads numba, and vLLM 0.32's CPU kernel overrides, registered as each engine is made, then fail on one of
    numba's objects (`'_lib_fn_wrapper' object has no attribute 'get'`)."""
    return config is None or config.get("method") != "ngram"


class VllmProcess:
    """The worker process, run by `python` (default: `vllm_python()`): `load` a config's engine, `generate` requests
    on it, `stop`."""

    def __init__(self, settings: Settings, python: Path | None = None) -> None:
        self.settings = settings
        self.config: dict | None = None  # the engine's speculative config, once loaded
        self.log = Path(tempfile.mkstemp(prefix="specdash-vllm-", suffix=".log")[1])
        with self.log.open("w") as log:
            self.process = subprocess.Popen([str(python or vllm_python()), str(WORKER)], stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=log, env=self.env(), text=True,
                                            start_new_session=True)

    def env(self) -> dict[str, str]:
        cores = ",".join(str(core) for core in sorted(os.sched_getaffinity(0))[: self.settings.threads])
        # vLLM's n-gram matcher runs in numba's thread pool, which otherwise starts a thread per core of the machine
        # beside the engine's threads bound to `cores`: on 2 cores its requests took 1.5-4x longer, and varied 8x.
        return {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": str(self.settings.kv_cache_gib),
                "VLLM_CPU_OMP_THREADS_BIND": cores, "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                "OMP_NUM_THREADS": str(self.settings.threads), "NUMBA_NUM_THREADS": str(self.settings.threads)}

    def load(self, config: dict | None) -> str:
        """The engine for `config`, made in place of the last one; vLLM's version. VllmError when vLLM refuses the
        config, or the process exits or does not answer in time."""
        s = self.settings
        answer = self.ask({"load": {"model": s.model, "dtype": s.dtype, "max_model_len": s.max_model_len, "seed": 0,
                                    "eager": s.eager, "speculative_config": config}}, s.start_timeout_s,
                          "vLLM did not start")
        self.config = config
        return answer["version"]

    def generate(self, prompts: list[list[int]], max_tokens: int, sampling: list[dict], timeout_s: float
                 ) -> list[dict]:
        """The prompts decoded together, each with its sampling; each reply in the shape of vLLM's server's
        completion response."""
        return self.ask({"generate": {"prompts": prompts, "max_tokens": max_tokens, "sampling": sampling}},
                        timeout_s, "vLLM did not decode the request")["replies"]

    def ask(self, command: dict, timeout_s: float, failed: str) -> dict:
        """The worker's answer to one command; VllmError starting with `failed` when it refuses or exits."""
        try:
            self.process.stdin.write(json.dumps(command) + "\n")
            self.process.stdin.flush()
            ready, _, _ = select.select([self.process.stdout], [], [], timeout_s)
            line = self.process.stdout.readline() if ready else None
        except BrokenPipeError:
            line = ""
        if line is None:
            self.stop(kill=True)
            raise VllmError(f"vLLM did not answer within {timeout_s:.0f} s: {last_line(self.log)}")
        if not line:
            self.process.wait()
            raise VllmError(f"{failed}: {last_line(self.log)} (log: {self.log})")
        try:
            answer = json.loads(line)
        except ValueError:
            self.stop(kill=True)
            raise VllmError(f"{failed}: its worker wrote {line.strip()[:100]!r}, not an answer") from None
        if "error" in answer:
            raise VllmError(f"{failed}: {answer['error']}")
        return answer

    def exited(self) -> bool:
        return self.process.poll() is not None

    def stop(self, kill: bool = False) -> None:
        """The process, and every process it started: it ends at the end of its input; whatever of its group is left
        after 30 s (at once with `kill`: a request it is still decoding) is killed. One left shutting down would take
        a core from whatever runs next."""
        if self.process.poll() is None and not kill:
            with contextlib.suppress(BrokenPipeError):
                self.process.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(30)
        deadline = time.monotonic() + 30
        with contextlib.suppress(ProcessLookupError):  # raised once no process of the group is left
            while time.monotonic() < deadline:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.poll()  # reaps the worker itself: a zombie still belongs to the group
                time.sleep(0.1)


# Lines that say nothing of why vLLM stopped: warnings, and what its bindings print as the process exits.
NOISE = ("warning", "warn(", "futurewarning", "triton", "nanobind", "leaked", "^^^", "~~~")


def last_line(log: Path) -> str:
    """The last line of the log that says something: an error's own line, not a traceback's frame or a warning."""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    for line in reversed(lines):
        if not line.startswith(("File ", "Traceback", "During handling", "The above exception", "- ")) and not any(
                noise in line.lower() for noise in NOISE):
            return line[-300:]
    return "no output"
