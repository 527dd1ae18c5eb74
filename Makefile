# Two commands set up a fresh machine and run the project:
#   make train   # create .venv, install, train on configs/shakespeare_char.yaml
#   make test    # create .venv, install, run the test suite (pytest)
# TORCH pins the PyTorch wheel: the default is the version we test with. For a CUDA
# build, see README.md (e.g. make train TORCH_INDEX=https://download.pytorch.org/whl/cu128).

PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
CONFIG ?= configs/shakespeare_char.yaml
PY := $(VENV)/bin/python

.PHONY: install train test test-fast tour bench-check bench gpu-wheels clean-venv

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

train: install
	$(PY) scripts/train.py --config $(CONFIG)

# Speed is measured by the benchmarks, not by the suite: the tests that time the machine
# (marked bench) run only in bench-check. The suite runs one pytest-xdist worker per core,
# each with one torch thread (most of its time is single-threaded: imports, subprocesses).
# Bytecode is cached even where PYTHONDONTWRITEBYTECODE is set: the suite's dozens of Python
# processes would each compile tinyattn from source again (__pycache__ is git-ignored).
TEST_RUN := PYTHONDONTWRITEBYTECODE= OMP_NUM_THREADS=1 $(PY) -m pytest -q -n auto

test: install
	$(TEST_RUN) -m "not bench and not tour"

test-fast: install  # also skips the tests marked slow (subprocesses, compile, kills, torchrun)
	$(TEST_RUN) -m "not slow and not bench"

# Executes notebooks/tour.ipynb in a kernel of $(PY) (about a minute of training, then the rest);
# fails on any cell that raises. The executed copy: notebooks/runs/tour.executed.ipynb.
tour: install
	$(PY) -m pytest -q -s -m tour tests/test_notebook.py

bench-check: install  # the wall-clock tests and the benchmark smoke run
	$(PY) -m pytest -q -m bench

# docs/BENCHMARKS.md's first command: compiled too, no dropout. It rewrites docs/bench-cpu.json, whose
# committed copy is of 2026-11-29 (4d5bc8a), older fields and a tied head (BENCHMARKS.md says which).
bench: install
	$(PY) -m benchmarks.suite --compile --set model.dropout=0.0 --json docs/bench-cpu.json

# Wheels for benchmarks/gpu_check.sh on the GPU machine (no network there; Python 3.12, its own
# torch): what tinyattn imports and that machine lacks, at the versions installed here, for
# its Python and for this one (the CPU rehearsal). The device README lists what it has.
GPU_WHEEL_PACKAGES ?= datasets dill multiprocess psutil
GPU_WHEEL_PLATFORMS := $(foreach p,manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64,--platform $(p))

gpu-wheels:
	rm -rf gpu-wheels
	pins="$$($(PY) -c 'import sys, importlib.metadata as m; print(" ".join(f"{p}=={m.version(p)}" for p in sys.argv[1:]))' $(GPU_WHEEL_PACKAGES))" && \
	echo "gpu-wheels: $$pins" && \
	$(PY) -m pip download --quiet --only-binary=:all: --no-deps -d gpu-wheels $$pins && \
	$(PY) -m pip download --quiet --only-binary=:all: --no-deps -d gpu-wheels \
		--python-version 3.12 --implementation cp $(GPU_WHEEL_PLATFORMS) $$pins
	ls gpu-wheels

clean-venv:
	rm -rf $(VENV)
