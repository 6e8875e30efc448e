# Everything installs into .venv at the repo root on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# torch and torchvision first, pinned to the CPU-usable releases this machine kind serves from disk;
# then the package with every extra and the dev tools.
TORCH_SPEC ?= torch==2.14.1 torchvision==0.29.1
PYTEST_ARGS ?=

.PHONY: setup demo test bench lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(TORCH_SPEC)
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/adaptcl demo --output-dir results/demo

test: $(STAMP)
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(BIN)/python -m pytest -q $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_losses.py
	$(BIN)/python benchmarks/bench_tiled.py

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks

clean:
	rm -rf $(VENV) results .pytest_cache .ruff_cache
