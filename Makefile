# Quick start: `make run` (the main job) and `make test` (the suite). Both set themselves up from a
# fresh clone: a virtual environment in .venv, then the dependencies. torch comes first and as the
# CPU build (a plain `pip install torch` would pull a multi-GB CUDA build), then DeepSpeed without
# build isolation (its setup.py imports torch), then this project.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_VERSION ?= 2.13.0
STATE_DIR ?= $(CURDIR)/state
PORT ?= 9410

BASE_STAMP := $(VENV)/.stamp-base
FULL_STAMP := $(VENV)/.stamp-full

.PHONY: install install-base importpath run test durations test-fast bench lint typecheck fmt clean demo triage-demo system-deps dist

install: $(FULL_STAMP)
install-base: $(BASE_STAMP)

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

# The daemon and triage only: what a GPU node needs (no torch).
$(BASE_STAMP): pyproject.toml | $(VENV)/bin/python
	$(PIP) install -q -e '.[daemon,dev]'
	$(MAKE) --no-print-directory importpath
	touch $@

# The source folders are watchdog/ and trainer/, the import names gpu_triage and ft_trainer. setuptools'
# editable install maps them with an import hook that type checkers and editors cannot follow; links in
# $(VENV)/importpath, put on sys.path by a .pth file, give them plain directories to read.
importpath: | $(VENV)/bin/python
	mkdir -p $(VENV)/importpath
	ln -sfn $(abspath watchdog) $(VENV)/importpath/gpu_triage
	ln -sfn $(abspath trainer) $(VENV)/importpath/ft_trainer
	$(PY) -c 'import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()["purelib"], "00-gpu-triage-importpath.pth").write_text("$(CURDIR)/$(VENV)/importpath\n")'

# Everything, including the trainer extra, in the order DeepSpeed needs.
$(FULL_STAMP): pyproject.toml $(BASE_STAMP)
	$(PIP) install -q 'torch==$(TORCH_VERSION)'
	$(PIP) install -q setuptools wheel
	DS_BUILD_OPS=0 $(PIP) install -q --no-build-isolation 'deepspeed>=0.14'
	$(PIP) install -q -e '.[daemon,trainer,dev]'
	touch $@

# Outside binaries the integration tests use (Debian packages); .ci/run calls this as root.
system-deps:
	./.ci/install-system-deps.sh

run: $(BASE_STAMP)
	$(VENV)/bin/gpu-watchdog demo-run --state-dir $(STATE_DIR) --port $(PORT)

# The whole story on this machine in a couple of minutes: the gate refuses an imbalanced plan, the real
# 2-rank DeepSpeed job deadlocks, the real daemon catches it, alerts a real Alertmanager and kills it.
demo: $(FULL_STAMP)
	@command -v prometheus-alertmanager >/dev/null || echo "(no prometheus-alertmanager: run 'make system-deps' as root for the alert part)"
	$(PY) -m ft_trainer.devtools.demo --out out/demo

# The suite side by side: two pytest-xdist workers per core. Most of its wall time is a few dozen tests
# that wait on real processes (a save throttled for 75 s, a daemon's confirm window), not on the CPU:
# on 2 cores, 4 workers kept the CPU ~87 % busy and took 11.7 min where 2 took 19.5. Tests that cannot
# share the machine with each other are grouped onto one worker (tests/conftest.py, XDIST_GROUPS). The
# longest tests go first (tests/scheduling.py, from tests/durations.json; --no-loadscope-reorder keeps
# that order). TEST_WORKERS=N sets the count; TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= $(shell echo $$(( 2 * $$(nproc 2>/dev/null || echo 1) )))
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder)

# --durations=30: every run (and CI's log) lists its 30 slowest tests, to keep an eye on them.
# Bytecode is cached (__pycache__, git-ignored) even where the environment says PYTHONDONTWRITEBYTECODE:
# without it every worker rewrote every test module's asserts (13 of a collection's CPU seconds, 8
# with the cache) and each of the suite's hundreds of daemons, ranks and CLI calls compiled the project.
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest
test: $(FULL_STAMP)
	$(PYTEST) -q $(XDIST) --durations=30 $(PYTEST_ARGS)

# The whole suite once, writing each test's seconds to tests/durations.json (the longest-first order).
durations: $(FULL_STAMP)
	$(PYTEST) -q $(XDIST) --store-durations $(PYTEST_ARGS)

test-fast: $(BASE_STAMP)
	$(PYTEST) -q $(XDIST) -m "not slow and not trainer" $(PYTEST_ARGS)

bench: $(FULL_STAMP)
	$(PY) -m benchmarks $(BENCH_ARGS)

# The wheel and the sdist, as a node installs them (docs/operator-guide.md, "Install on a node").
# Without build isolation: setuptools and wheel come from the [dev] extra already in the venv, so this
# needs no package index (an isolated build would download setuptools).
dist: $(BASE_STAMP)
	rm -rf dist build  # a stale build/ would ship modules since moved or deleted
	$(PY) -m build --no-isolation --outdir dist .
	@ls -l dist

lint: $(BASE_STAMP)
	$(VENV)/bin/ruff check watchdog trainer tests benchmarks
	$(VENV)/bin/ruff format --check watchdog trainer tests benchmarks

# mypy over both import packages (pyproject.toml [tool.mypy]: strict on model/, verdicts/, classify/ and
# the contract); the trainer's modules need the trainer extra's libraries.
typecheck: $(FULL_STAMP)
	$(PY) -m mypy

fmt: $(BASE_STAMP)
	$(VENV)/bin/ruff check --fix watchdog trainer tests benchmarks
	$(VENV)/bin/ruff format watchdog trainer tests benchmarks

clean:
	rm -rf $(VENV) $(STATE_DIR) out build dist *.egg-info .pytest_cache .ruff_cache .hypothesis
