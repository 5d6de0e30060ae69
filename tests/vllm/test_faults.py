"""vLLM's faults as one line: a missing environment, a server that does not start (its log's last meaningful line),
a draft vLLM refuses; nothing recorded is lost."""

from __future__ import annotations

import pytest

from runner.vllm.server import Server, ServerSettings, VllmError, last_line, vllm_python


def test_no_environment_names_the_target_that_builds_it(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDASH_VLLM_PYTHON", str(tmp_path / "bin" / "python"))
    with pytest.raises(VllmError, match=r"^no vLLM environment at .*: build it with `make vllm-env`$"):
        vllm_python()


def test_the_log_s_last_meaningful_line_is_its_error(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("INFO starting\nTraceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
                   "ValueError: the model does not exist\n/x.py:3: FutureWarning: deprecated\n"
                   "nanobind: leaked 64 types!\n - leaked type \"x\"\n")
    assert last_line(log) == "ValueError: the model does not exist"


def test_a_server_that_cannot_start_says_why_in_one_line(monkeypatch, tmp_path):
    # An interpreter that fails as vLLM does on a model it cannot load: a traceback, then exit 1.
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.write_text("#!/bin/sh\necho 'INFO starting'\necho 'Traceback (most recent call last):'\n"
                      "echo 'OSError: no-model does not appear to have a file named config.json'\nexit 1\n")
    python.chmod(0o755)
    monkeypatch.setenv("SPECDASH_VLLM_PYTHON", str(python))
    server = Server(ServerSettings(str(tmp_path / "no-model")), None)
    with pytest.raises(VllmError) as refused:
        server.wait()
    assert str(refused.value) == ("vLLM did not start: OSError: no-model does not appear to have a file named "
                                  f"config.json (log: {server.log})")
