# The one list of commands. Every target that needs the project installs it into .venv itself,
# so on a fresh machine `make demo` and `make test` are all it takes.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# pytest-xdist processes for `make test`: the default suite is CPU-bound, and this machine has 2 cores
TEST_WORKERS ?= 2

.DEFAULT_GOAL := help
.PHONY: help install browser demo demo-oom demo-soak demo-tune test test-slow test-e2e lint typecheck bench gpu-check clean

help: ## List the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP) ## Create .venv and install oomload with its dev tools

demo: $(STAMP) ## The main job on built-in defaults: replay a sample trace against the simulated vLLM
	$(BIN)/oomload replay traces/sample-chat.jsonl --max-duration-s 180

demo-oom: $(STAMP) ## The simulated vLLM under a host-memory limit: preemption, then a memory death, named and sized
	$(BIN)/oomload replay traces/sample-chat.jsonl --max-duration-s 180 \
	  --sim="--host-memory-limit-mib 400 --host-limit-kind process --host-bytes-per-token 16384 \
	  --gpu-memory-utilization 0.9 --max-num-batched-tokens 8192"

demo-soak: $(STAMP) ## A 150 s soak at concurrency 4 against a simulated vLLM that leaks 30 MiB a minute
	$(BIN)/oomload replay traces/sample-chat.jsonl --soak 150s --concurrency 4 --sim="--host-leak-mib-per-min 30"

demo-tune: $(STAMP) ## oomload starts the simulated vLLM itself and tunes its memory settings for concurrency 8
	$(BIN)/oomload tune traces/sample-chat.jsonl --target-concurrency 8 --utilization 0.9,0.85,0.8 \
	  --serve 'oomload sim serve --model llama-3.1-8b --gpu l4 --other-process-gib 4 --max-model-len 8192 --time-scale 0.02'

test: $(STAMP) browser ## Run the default test suite (fast; simulated server, real Locust, headless Chromium), on 2 processes
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal

test-slow: $(STAMP) browser ## The slow drills: signals, kill -9, master and workers, tune, a browser on a live run (CI runs them)
	$(BIN)/python -m pytest -q -m slow

.e2e/.installed: | $(STAMP)
	$(BIN)/python -m oomload.realvllm.install --root .e2e

test-e2e: $(STAMP) .e2e/.installed ## End-to-end tests against a real vLLM (CPU build, tiny local model); installs it into .e2e/
	$(BIN)/python -m pytest -q -m e2e tests/e2e

browser: ## Install Debian's chromium (report.html browser test) when it is missing; needs root
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

lint: $(STAMP) ## ruff + mypy
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy

bench: $(STAMP) ## Benchmarks; each prints ratios against a baseline measured in the same run
	$(BIN)/python -m bench

gpu-check: $(STAMP) ## On an NVIDIA GPU: the NVML sampler sees a known allocation; TUNE_MODEL=M also tunes M with vLLM
	$(BIN)/python bench/gpu_check.py $(if $(TUNE_MODEL),--tune-model $(TUNE_MODEL))

clean: ## Remove the virtual environment, caches and run directories
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache runs build dist src/*.egg-info
