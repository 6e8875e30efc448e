# Everything installs into .venv at the repo root on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# torch and torchvision first, pinned to the CPU-usable releases this machine kind serves from disk;
# then the package with every extra and the dev tools.
TORCH_SPEC ?= torch==2.14.1 torchvision==0.29.1
PYTEST_ARGS ?=

.PHONY: setup demo test bench lint docs floors clean

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

# The site: Sphinx + MyST + furo from the `docs` extra, warnings are errors (-W), all of them
# reported before failing (--keep-going). Output: docs/_build/html/index.html.
DOCS_STAMP := $(VENV)/.docs-installed

$(DOCS_STAMP): pyproject.toml $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[docs]"
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(BIN)/python -m sphinx -W --keep-going -q -b html docs docs/_build/html

# Dependency floors: one venv per extra with the lowest versions pyproject.toml allows, then
# that extra's adapter tests (.ci/check_floors.sh; EXTRAS="vision text graph" by default).
floors:
	TORCH_SPEC="$(TORCH_SPEC)" PYTHON=$(PYTHON) bash .ci/check_floors.sh

clean:
	rm -rf $(VENV) results .pytest_cache .ruff_cache docs/_build docs/_generated dist
