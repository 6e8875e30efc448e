# Everything installs into .venv at the repo root on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# torch and torchvision first, pinned to the CPU-usable releases this machine kind serves from disk;
# then the package with every extra and the dev tools.
TORCH_SPEC ?= torch==2.14.1 torchvision==0.29.1
PYTEST_ARGS ?=

.PHONY: setup demo test test-pins bench kernel-report gpu-check lint docs floors mutate clean

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

# The tests that check a trained number (marker pins_result: determinism, and agreement with a
# published value within a tolerance measured across CPU kernels) once more on other kernels than
# this CPU's own: ATen's scalar path (ATEN_CPU_CAPABILITY=default) and oneDNN capped at AVX2 (the
# convolutions of an AVX2-only CPU). A value pinned to one machine's kernels fails here before it
# reaches a user.
PIN_KERNELS ?= ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=AVX2

test-pins: $(STAMP)
	$(PIN_KERNELS) HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(BIN)/python -m pytest -q -m pins_result $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_losses.py
	$(BIN)/python benchmarks/bench_tiled.py

# The fused kernels' report (docs/large_batches.md, "The kernel report"): every launch the losses
# can make, compiled for sm_80 and sm_90 on this CPU with Triton's bundled ptxas and cuobjdump,
# one markdown row each (registers, spills, CTAs per SM, MMA family, serialised wgmma, SASS
# instructions and MUFU operations per tile element against InfoNCE's). Everything takes long
# on two cores; KERNEL_REPORT_ARGS="--arch 90 --precision bf16 --width 128" is the docs' table.
KERNEL_REPORT_ARGS ?=

kernel-report: $(STAMP)
	$(BIN)/python -m benchmarks.kernel_report $(KERNEL_REPORT_ARGS)

# The GPU check (docs/gpu.md): CUDA tests, GPU benchmark and every recipe on the GPU, each under
# its own time limit, at most 9 minutes in all, the fused kernels' targets first; report in
# results/gpu-check/ (report.md, report.json).
# Meant for a CUDA machine holding the project and its wheels, so it needs no venv: the venv's
# Python when there is one, else $(PYTHON) (one line saying to run `make setup` if it has no
# torch). GPU_CHECK_ARGS="--device cpu --tiny": the CPU path, a few minutes.
GPU_CHECK_ARGS ?=
GPU_CHECK_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))

gpu-check:
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(GPU_CHECK_PYTHON) tools/gpu_check.py $(GPU_CHECK_ARGS)

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
# that extra's adapter tests (.ci/check_floors.sh; EXTRAS="vision text graph clip" by default).
floors:
	TORCH_SPEC="$(TORCH_SPEC)" PYTHON=$(PYTHON) bash .ci/check_floors.sh

# Mutation testing of src/adaptcl/plugins against tests/plugins with mutmut (the `mutate` extra;
# configuration in setup.cfg, reading the report: docs/mutation.md). Not part of CI. The default
# is a reproducible random sample; MUTATE_ARGS="--sample 0" runs all ~4,700 mutants. One torch
# thread: mutmut forks a process per mutant, and OpenMP does not survive a fork once used.
MUTATE_STAMP := $(VENV)/.mutate-installed
MUTATE_ARGS ?= --sample 300 --seed 2026 --max-children 2

$(MUTATE_STAMP): pyproject.toml $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[mutate]"
	touch $(MUTATE_STAMP)

mutate: $(MUTATE_STAMP)
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
		$(BIN)/python tools/mutate.py $(MUTATE_ARGS)

clean:
	rm -rf mutants $(VENV) results .pytest_cache .ruff_cache docs/_build docs/_generated dist
