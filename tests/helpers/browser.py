"""The browser the tests drive: Debian's Chromium headless shell, launched as the benches launch it but lighter."""

from __future__ import annotations

from bench.load import CHROMIUM, LAUNCH_ARGS

__all__ = ["CHROMIUM", "TEST_LAUNCH_ARGS"]

# The tests' Chromium runs V8 without its optimising compilers: the pages' scripts run once or twice, so compiling
# them costs more than it saves. Twenty sessions at once took less CPU so (102 and 114 CPU s against 117 and 123 on
# 2 cores, two runs each); the pages and what the tests assert of them are the same. The benches keep the default.
TEST_LAUNCH_ARGS = [*LAUNCH_ARGS, "--js-flags=--jitless"]
