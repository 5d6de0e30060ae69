"""A vLLM server started here, in vLLM's own environment (`make vllm-env`), for one speculative config.

Start-up on this project's small CPUs is mostly imports: `--enforce-eager` skips torch.compile (minutes on 2 busy
cores), the `uni` executor runs the model in the engine's process instead of a third one, and no graph capture is
waited for. Timings are then eager vLLM's, which is what a CPU deployment runs unless it compiles.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
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
class ServerSettings:
    """How a server is started; one per sweep, whatever its speculative configs."""

    model: str  # the directory (or cached repo id) vLLM loads
    threads: int = 1  # CPU cores its OpenMP threads are bound to (0..threads-1)
    dtype: str = "float32"  # the target's dtype, as our engine runs it on CPU
    max_model_len: int = 2048  # the longest sequence it serves: prompt and new tokens (the engine sets it)
    kv_cache_gib: int = 1  # VLLM_CPU_KVCACHE_SPACE: a few requests of a 135M model need little
    start_timeout_s: float = 900.0  # a first start under load compiles and imports for minutes


class Server:
    """One `vllm serve` on a free loopback port, with per-step metrics; stopped by `stop`."""

    def __init__(self, settings: ServerSettings, config: dict | None) -> None:
        self.settings, self.config = settings, config
        self.log = Path(tempfile.mkstemp(prefix="specdash-vllm-", suffix=".log")[1])
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        with self.log.open("w") as out:
            self.process = subprocess.Popen(self.command(), stdout=out, stderr=subprocess.STDOUT, env=self.env(),
                                            start_new_session=True)

    def command(self) -> list[str]:
        s = self.settings
        command = [str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server", "--model", s.model,
                   "--host", "127.0.0.1", "--port", str(self.port), "--dtype", s.dtype,
                   "--max-model-len", str(s.max_model_len), "--enforce-eager", "--distributed-executor-backend",
                   "uni", "--enable-per-request-metrics", "--seed", "0"]
        if self.config is not None:  # detailed: every verify step's accepted and drafted counts
            command += ["--speculative-config", json.dumps(self.config), "--per-request-spec-decode-metrics",
                        "detailed"]
        return command

    def env(self) -> dict[str, str]:
        cores = "0" if self.settings.threads == 1 else f"0-{self.settings.threads - 1}"
        # vLLM's n-gram matcher runs in numba's thread pool, which otherwise starts a thread per core of the machine
        # beside the engine's threads bound to `cores`: on 2 cores its requests took 1.5-4x longer, and varied 8x.
        return {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": str(self.settings.kv_cache_gib),
                "VLLM_CPU_OMP_THREADS_BIND": cores, "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                "OMP_NUM_THREADS": str(self.settings.threads), "NUMBA_NUM_THREADS": str(self.settings.threads)}

    def wait(self) -> None:
        """Until the server answers /health; VllmError with its log's last meaningful line when it exits first or
        the deadline passes."""
        deadline = time.monotonic() + self.settings.start_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise VllmError(f"vLLM did not start: {last_line(self.log)} (log: {self.log})")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as reply:
                    if reply.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1.0)
        self.stop()
        raise VllmError(f"vLLM did not answer within {self.settings.start_timeout_s:.0f} s: {last_line(self.log)}")

    def died(self) -> str | None:
        """Why the server is gone (its log's last meaningful line), or None while it runs."""
        return None if self.process.poll() is None else f"vLLM exited: {last_line(self.log)}"

    def stop(self) -> None:
        """The server and its engine process, by their process group; killed if they do not stop in 30 s."""
        if self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


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
