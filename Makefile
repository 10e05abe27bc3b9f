# clmf — set-up and everyday targets.  `make help` lists them.
#
#   make demo        set up everything, then run `clmf demo`
#   make test        set up everything, then run the full test tier (not slow, not perf; CI)
#   make test-fast   the inner-loop tier (<= 4 min on 2 cores): tests/conftest.py FAST_TIER
#
# Set-up (scripts/setup.sh) installs the OpenCL system packages, creates .venv, installs the
# Python dependencies (redone only when pyproject.toml or setup.sh change), and on every
# demo/test run rebuilds the clmf wheel and reinstalls it, so the installed package always
# matches the sources.  Tests and demo see PoCL and Intel's CPU runtime through .icd/.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

VENV    := .venv
ICD_DIR := $(CURDIR)/.icd
STAMP   := $(VENV)/.clmf-deps.stamp
SETUP   := bash scripts/setup.sh

# pytest selection; override e.g. `make test PYTEST_ARGS="-x -k cholesky"` or MARKERS="slow"
MARKERS     ?= not slow and not perf
PYTEST_ARGS ?=
# pytest-xdist worker processes for test and test-fast (0: one process, e.g. for -s or --pdb);
# a test file runs whole in one worker, but for the large kernel matrices (tests/conftest.py)
PYTEST_WORKERS ?= 2
XDIST = $(if $(filter-out 0,$(PYTEST_WORKERS)),-n $(PYTEST_WORKERS) --dist loadscope)
DEMO_ARGS   ?=

# Environment of every command that runs clmf: the ICD vendors dir with PoCL + Intel, no
# PYTHONPATH (the installed wheel, not the checkout, must be imported).
RUN_ENV := env -u PYTHONPATH OCL_ICD_VENDORS=$(ICD_DIR)
TEST_ENV := $(RUN_ENV) CLMF_TEST_INSTALLED=1

.PHONY: help setup install demo test test-fast test-all test-oclgrind test-pip docs platforms \
        register-intel unregister-intel clean distclean

help:
	@echo "make demo             set up, then run .venv/bin/clmf demo (DEMO_ARGS=...)"
	@echo "make test             set up, then ruff check and pytest -m '$(MARKERS)' (PYTEST_ARGS=...)"
	@echo "make test-fast        the same on the fast tier (tests/conftest.py FAST_TIER, one CPU device)"
	@echo "make test-all         all tests, slow and perf included"
	@echo "make test-oclgrind    the race/out-of-bounds tests under Oclgrind"
	@echo "make test-pip         the pip-only path: fresh venv, wheel + PyPI's pyopencl[pocl], README example"
	@echo "make docs             build the documentation site (site/, warnings as errors) and run its doctests"
	@echo "make setup            system packages, .venv, dependencies, clmf wheel, .icd/"
	@echo "make platforms        list the OpenCL platforms/devices clmf will see"
	@echo "make register-intel   register .venv's Intel CPU OpenCL runtime system-wide (root/sudo)"
	@echo "make unregister-intel undo register-intel"
	@echo "make clean            remove build output and caches (keeps .venv); distclean: also .venv"

# System packages, venv and dependencies: only when the inputs change (or .venv is gone).
$(STAMP): pyproject.toml scripts/setup.sh
	$(SETUP) --deps
	touch $@

# The project wheel: rebuilt and reinstalled every time, since the sources change.
install: $(STAMP)
	$(SETUP) --project

setup: install

demo: install
	$(RUN_ENV) $(VENV)/bin/clmf demo $(DEMO_ARGS)

# --import-mode=importlib and .venv/bin/pytest (not `python -m pytest`): the repo root is not put
# on sys.path, so the tests import the installed wheel.  Exit status 5 (no tests collected) fails.
define run_pytest
	@echo '+ $(TEST_ENV) $(VENV)/bin/pytest --import-mode=importlib $(1) $(PYTEST_ARGS)'
	@rc=0; $(TEST_ENV) $(VENV)/bin/pytest --import-mode=importlib $(1) $(PYTEST_ARGS) || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make: pytest collected no tests -- treated as a failure" >&2; fi; \
	exit $$rc
endef

LINT := $(VENV)/bin/ruff check clmf tuner cl_kernels tests scripts benchmarks docs

# the full tier (CI): every test not marked slow or perf, on every OpenCL device
test: install
	$(LINT)
	$(call run_pytest,-m "$(MARKERS)" $(XDIST))

# the fast tier: reference agreement, the public calls, the behaviour suite on one CPU device
# (CLMF_TEST_DEVICE=intel picks another); the list is FAST_TIER in tests/conftest.py
test-fast: install
	$(LINT)
	$(call run_pytest,-m "$(MARKERS)" --tier=fast $(XDIST))

test-all: install
	$(call run_pytest,)

test-oclgrind: install
	@command -v oclgrind >/dev/null || { echo "oclgrind is not installed (make setup installs it)" >&2; exit 1; }
	$(call run_pytest,-m oclgrind)

# The pip-only install path (no root, no system OpenCL): a fresh venv with the built wheel and
# PyPI's pyopencl[pocl], system runtimes hidden, the README's first example (needs the network).
test-pip: install
	bash scripts/pip_only_check.sh

# The documentation site: MkDocs with mkdocstrings (API pages from the numpydoc docstrings),
# warnings as errors, into site/; then every >>> example of docs/*.md runs as a doctest against
# the installed wheel (docs/conftest.py: from the repository root, shared data checked).
DOCTEST_FLAGS := NUMBER ELLIPSIS NORMALIZE_WHITESPACE
docs: install
	$(RUN_ENV) $(VENV)/bin/mkdocs build --strict
	$(call run_pytest,--doctest-glob="*.md" -o doctest_optionflags="$(DOCTEST_FLAGS)" -p no:cacheprovider docs)

platforms: $(STAMP)
	$(SETUP) --icd --check

register-intel: $(STAMP)
	$(SETUP) --register-intel

unregister-intel:
	$(SETUP) --unregister-intel

clean:
	rm -rf build dist .icd .pytest_cache *.egg-info
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
