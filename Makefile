# Supported build: a virtualenv at .venv with requirements.txt and `pip install -e .`.
# `make demo` and `make test` create it on first use and reuse it afterwards.

PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=
# Test workers (pytest-xdist); each holds a TF process of up to a few GB.
# Tests are handed out two at a time: with xdist's default chunks the first
# worker got every zoo test (they are collected first) and ran them alone.
PYTEST_WORKERS ?= 2
BENCH_ARGS ?=

.PHONY: all venv demo test bench clean distclean

all: test

venv: $(STAMP)

# Reinstalled only when one of these files is newer than the stamp.
$(STAMP): requirements.txt requirements-nodeps.txt setup.py pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -r requirements-nodeps.txt
	$(PY) -m pip install --quiet -e .
	@touch $@

demo: $(STAMP)
	$(PY) -m tf_fusionstitch.tools.demo

test: $(STAMP)
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --maxschedchunk=2 tests $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) benchmarks/patterns.py $(BENCH_ARGS)

# Build outputs and caches; keeps the virtualenv (see distclean).
clean:
	rm -rf build dist .pytest_cache
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
