# Supported build: a virtualenv at .venv with requirements.txt and `pip install -e .`.
# `make demo` and `make test` create it on first use and reuse it afterwards.
# `make test` also keeps a second, TF-free virtualenv inside it (.venv/core, with
# requirements-core.txt alone) and runs the `core` tests there: that is what
# shows the core (fusion IR, schedule, codegen, runtime, gpu) needs no TensorFlow.

PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
CORE_VENV  := $(VENV)/core
CORE_PY    := $(CORE_VENV)/bin/python
CORE_STAMP := $(CORE_VENV)/.installed
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
$(STAMP): requirements.txt requirements-core.txt requirements-nodeps.txt setup.py pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -r requirements-nodeps.txt
	$(PY) -m pip install --quiet -e .
	@touch $@

# The package without its dependencies: the core needs only requirements-core.txt.
$(CORE_STAMP): $(STAMP) requirements-core.txt
	@test -x $(CORE_PY) || $(PYTHON) -m venv $(CORE_VENV)
	$(CORE_PY) -m pip install --quiet --upgrade pip
	$(CORE_PY) -m pip install --quiet -r requirements-core.txt
	$(CORE_PY) -m pip install --quiet --no-deps -e .
	@touch $@

demo: $(STAMP)
	$(PY) -m tf_fusionstitch.tools.demo

# The TF-free tests where TensorFlow is not installed, then the others with it:
# the whole models (tests/models), in two parts, each in workers of their own,
# which exit with the memory they hold (a worker's memory grows with every
# model it builds: one that went on to the planner's multi-process tests
# reached 12 GB and was killed on a 24 GB machine), then the rest.
# The four pytest runs share one kernel cache (tests/conftest.py), so the op
# library is built once and a kernel two parts both use is compiled once.
test: $(STAMP) $(CORE_STAMP)
	@cache=$$(mktemp -d -t tf_fusionstitch-make-test-XXXXXX) && chmod 700 $$cache \
		&& trap 'rm -rf '$$cache EXIT && export TF_FUSIONSTITCH_TEST_SESSION_CACHE=$$cache \
		&& { $(CORE_PY) -m pytest -q -n $(PYTEST_WORKERS) --maxschedchunk=2 -m core tests \
			$(PYTEST_ARGS) || test $$? -eq 5; } \
		&& for part in 1/2 2/2; do TF_FUSIONSTITCH_TEST_MODEL_PART=$$part \
			$(PY) -m pytest -q -n $(PYTEST_WORKERS) --maxschedchunk=2 --durations=15 \
			-m "not core" tests/models $(PYTEST_ARGS) || test $$? -eq 5 || exit 1; done \
		&& { $(PY) -m pytest -q -n $(PYTEST_WORKERS) --maxschedchunk=2 --durations=15 \
			-m "not core" --ignore=tests/models tests $(PYTEST_ARGS) || test $$? -eq 5; }

bench: $(STAMP)
	$(PY) benchmarks/patterns.py $(BENCH_ARGS)

# Build outputs and caches; keeps the virtualenv (see distclean).
clean:
	rm -rf build dist .pytest_cache
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
