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

.PHONY: install train test test-fast bench clean-venv

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

train: install
	$(PY) scripts/train.py --config $(CONFIG)

test: install
	$(PY) -m pytest -q

test-fast: install  # everything but the tests marked slow (subprocesses, compile, kills, torchrun)
	$(PY) -m pytest -q -m "not slow"

bench: install
	$(PY) scripts/bench.py --json docs/bench-cpu.json

clean-venv:
	rm -rf $(VENV)
