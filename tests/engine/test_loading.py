"""Loading a model says what is wrong in one line, before it costs anything: weights that will not fit, a Hub
that refuses or cannot be reached, a checkpoint that would leave weights at random, code that must be trusted."""

from __future__ import annotations

import hashlib
import http.server
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from huggingface_hub.errors import LocalEntryNotFoundError
from huggingface_hub.utils import httpx
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig
from typer.testing import CliRunner

from runner import cli
from runner.engine.weights import loading, sources
from tests.end_to_end.test_cli import assert_one_line_error
from tests.helpers.families import BY_NAME, save, tokenizer

ROOT = Path(__file__).resolve().parents[2]


def generate(target: str, *extra: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli.app, ["generate", "--target", target, "--draft", "ngram", "--k", "2",
                                          "--max-new-tokens", "4", "--prompt", "the river", *extra])
    return result.exit_code, result.stderr


def test_a_model_that_does_not_fit_is_refused_before_its_weights_load(tmp_path):
    # ~51 billion parameters: 190 GiB in float32, on a machine of 24 GiB. Only a config and a tokenizer exist.
    config = LlamaConfig(vocab_size=300, hidden_size=32768, intermediate_size=65536, num_hidden_layers=4,
                         num_attention_heads=32, num_key_value_heads=32)
    config.save_pretrained(tmp_path)
    tokenizer().save_pretrained(tmp_path)
    per_layer = 4 * 32768**2 + 3 * 32768 * 65536 + 2 * 32768
    params = 4 * per_layer + 2 * 300 * 32768 + 32768  # layers, embeddings and head, final norm
    code, err = generate(str(tmp_path))
    assert_one_line_error(code, err, f'does not fit: its weights need {params * 4 / 2**30:.1f} GiB in float32 and '
                                     "cpu has")


def test_the_fit_check_counts_free_memory_against_the_weights():
    assert loading.fit_problem("m", 9 * 2**30, 10 * 2**30, "cuda:1", "bf16") is None
    assert loading.fit_problem("m", 10 * 2**30, 10 * 2**30, "cuda:1", "bf16") == (
        '"m" does not fit: its weights need 10.0 GiB in bf16 and cuda:1 has 10.0 GiB free (90% of it may go to '
        "weights)")
    assert loading.fit_problem("m", 10 * 2**30, None, "mps", "bf16") is None  # unknown free memory: no guess


def test_weights_missing_from_the_checkpoint_are_refused_not_left_random(tmp_path):
    path = save(BY_NAME["llama"], tmp_path, 2, 300, seed=1)
    weights = load_file(path / "model.safetensors")
    del weights["model.layers.1.mlp.up_proj.weight"]
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    code, err = generate(str(path))
    assert_one_line_error(code, err, "1 weight(s) missing from the checkpoint and 0 of the wrong shape "
                                     "(e.g. model.layers.1.mlp.up_proj.weight) would be initialised at random")


CUSTOM_CODE = '''
from transformers import LlamaConfig, LlamaForCausalLM


class TinyConfig(LlamaConfig):
    model_type = "tiny_custom"


class TinyForCausalLM(LlamaForCausalLM):
    config_class = TinyConfig
'''


def test_a_checkpoint_with_its_own_code_needs_trust_remote_code(tmp_path):
    path = save(BY_NAME["llama"], tmp_path, 2, 300, seed=1)
    (path / "tiny_custom.py").write_text(CUSTOM_CODE)
    config = (path / "config.json").read_text().replace('"model_type": "llama"', '"model_type": "tiny_custom", '
        '"auto_map": {"AutoConfig": "tiny_custom.TinyConfig", "AutoModelForCausalLM": "tiny_custom.TinyForCausalLM"}')
    (path / "config.json").write_text(config)
    code, err = generate(str(path))
    assert_one_line_error(code, err, "ships its own model code; read it, then pass --trust-remote-code")
    code, err = generate(str(path), "--trust-remote-code")
    assert code == 0, err


class RefusingHub(http.server.BaseHTTPRequestHandler):
    """Answers like the Hub for a gated repository and for one that is private or absent."""

    def do_HEAD(self) -> None:
        code, error = (403, "GatedRepo") if "/gated/" in self.path else (401, "RepoNotFound")
        self.send_response(code)
        self.send_header("X-Error-Code", error)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD

    def log_message(self, *args: object) -> None:
        pass


def test_a_gated_or_private_repository_is_told_apart_from_a_missing_cache(tmp_path):
    hub = http.server.ThreadingHTTPServer(("127.0.0.1", 0), RefusingHub)
    threading.Thread(target=hub.serve_forever, daemon=True).start()
    script = textwrap.dedent("""
        from runner.engine.weights import models
        for repo in ("org/gated", "org/private"):
            try:
                models.load(repo)
            except models.ModelError as error:
                print(error)
    """)
    env = {**os.environ, "HF_ENDPOINT": f"http://127.0.0.1:{hub.server_address[1]}", "HF_HUB_OFFLINE": "0",
           "HF_HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    try:
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    finally:
        hub.shutdown()
    assert out.stdout.splitlines() == [
        'cannot load model: "org/gated" is a gated repository: ask for access on its Hub page, then log in '
        "(hf auth login, HF_TOKEN)",
        'cannot load model: "org/private" is not on the Hub, or it is private and no token with access was given '
        "(HTTP 401/404)"], out.stderr


def test_an_unreachable_hub_is_a_network_problem_and_an_offline_miss_says_how_to_download():
    # The chain transformers raises when the Hub cannot be reached (seen with HF_ENDPOINT on a closed port).
    try:
        try:
            try:
                raise httpx.ConnectError("[Errno 111] Connection refused")
            except httpx.ConnectError as connect:
                raise LocalEntryNotFoundError("cannot reach the Hub") from connect
        except LocalEntryNotFoundError as entry:
            raise OSError("We couldn't connect to the Hub") from entry
    except OSError as error:
        assert loading.hub_problem(error, "org/m", offline=False) == (
            'cannot reach the Hub for "org/m" ([Errno 111] Connection refused), and it is not in the local Hugging '
            "Face cache")
    offline = OSError("not cached")
    offline.__cause__ = LocalEntryNotFoundError("offline")
    assert loading.hub_problem(offline, "org/m", offline=True) == (
        '"org/m" is not in the local Hugging Face cache, and downloads are off (HF_HUB_OFFLINE=0 allows them)')


def test_a_draft_that_cannot_embed_every_id_the_target_writes_is_refused(tmp_path):
    qwen = BY_NAME["qwen2"]
    target = save(qwen, tmp_path / "target", 2, 332, seed=1)
    narrow = save(qwen, tmp_path / "narrow", 2, 280, seed=2)  # the tokenizer has 300 ids
    code, err = generate(str(target), "--draft", f"model:{narrow}")
    assert_one_line_error(code, err, f'draft "{narrow}" embeds 280 token ids, fewer than the 300 that target '
                                     f'"{target}" can write')


def test_processes_converting_one_gguf_at_once_convert_it_once(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDASH_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    calls = []

    def convert(source: Path, done: Path) -> None:  # a slow conversion, so that both callers overlap
        calls.append(source)
        time.sleep(0.5)
        done.mkdir()
        (done / "config.json").write_text("{}")

    monkeypatch.setattr(sources, "_convert", convert)
    results = []
    callers = [threading.Thread(target=lambda: results.append(sources.dequantized(gguf))) for _ in range(2)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    assert calls == [gguf] and results == [sources.converted_dir(gguf)] * 2


def test_copies_of_one_gguf_share_one_conversion_and_another_content_gets_its_own(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDASH_CACHE", str(tmp_path / "cache"))
    (tmp_path / "venv1").mkdir()
    (tmp_path / "venv2").mkdir()
    first, second, other = tmp_path / "venv1/m.gguf", tmp_path / "venv2/m.gguf", tmp_path / "m.gguf"
    first.write_bytes(b"GGUF" + bytes(range(256)) * 10)
    second.write_bytes(first.read_bytes())
    other.write_bytes(b"GGUF" + bytes(range(255, -1, -1)) * 10)  # the same size, other bytes
    digest = hashlib.sha256(first.read_bytes()).hexdigest()[:16]
    assert sources.converted_dir(first) == sources.converted_dir(second) == tmp_path / "cache" / f"m-{digest}"
    assert sources.converted_dir(other) != sources.converted_dir(first)
