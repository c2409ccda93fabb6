# hir: `make demo` and `make test` are the only commands a new user types; each sets up .venv first.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
export DAGSTER_HOME ?= $(CURDIR)/.hir/dagster_home
export HIR_DATA_DIR ?= $(CURDIR)/data
export GX_ANALYTICS_ENABLED := false
export DAGSTER_DISABLE_TELEMETRY := 1
# No wheel cache: the stack is ~6.6 GB in .venv already, and a cached copy has filled a CI disk before.
export PIP_NO_CACHE_DIR := 1

.PHONY: demo test test-fast ui data bench clean

# The demo and the UI embed text in bfloat16 where the CPU computes it natively (AMX/AVX512-BF16: 2.8x faster, same
# neighbours) and in float32 elsewhere (emulated bfloat16 is 7x slower); both set it, so runs launched from the UI reuse
# the demo's vectors (the resolved dtype is part of the encoder version).
demo ui: export HIR_TEXT_DTYPE ?= auto

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $@

$(DAGSTER_HOME)/dagster.yaml:  ## the local instance (deploy/dagster.local.yaml: SQLite, a `gpu` pool of 1, run retries); kept once written
	@mkdir -p $(DAGSTER_HOME)
	cp deploy/dagster.local.yaml $@

data: $(VENV)/.installed  ## fetch (MovieLens) or generate (synthetic) the configured source's data
	$(VENV)/bin/hir prepare

demo: $(VENV)/.installed $(DAGSTER_HOME)/dagster.yaml data  ## materialise every window end to end, print a summary
	$(PY) -m dagster_project.demo

test: $(VENV)/.installed  ## the whole suite (CI runs this)
	HIR_SOURCE=movielens $(VENV)/bin/hir prepare
	$(PY) -m pytest -q -ra

test-fast: $(VENV)/.installed  ## everything but the slow end-to-end tests
	$(PY) -m pytest -q -m "not slow"

# The UI needs the source's data (its partitions are the data's windows): `data` fetches or generates it first.
ui: $(VENV)/.installed $(DAGSTER_HOME)/dagster.yaml data  ## the Dagster UI on the demo's instance, on 127.0.0.1 only
	@echo "hir ui: http://127.0.0.1:3000  instance $(DAGSTER_HOME)  alerts $(DAGSTER_HOME)/alerts.jsonl"
	$(VENV)/bin/dagster dev -h 127.0.0.1 -p 3000 -w workspace.yaml

bench: $(VENV)/.installed
	$(PY) benchmarks/ingest.py
	$(PY) benchmarks/graph.py

clean:
	rm -rf .hir
