# hir: `make demo` and `make test` are the only commands a new user types; each sets up .venv first.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
# One Dagster instance per source: .hir/dagster_home/<source> unless DAGSTER_HOME is set (dagster_project/instance.py).
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

DAGSTER_PATCH := patches/dagster-paginated-partition-keys-end.patch

$(VENV)/.installed: pyproject.toml $(DAGSTER_PATCH)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@# the pinned Dagster plots no partition of a set whose end date has passed: carry the upstream fix (see the patch)
	@site=$$($(PY) -c 'import dagster, pathlib; print(pathlib.Path(dagster.__file__).parents[1])'); \
	  patch -s -R -p1 --dry-run -d "$$site" < $(DAGSTER_PATCH) >/dev/null 2>&1 || patch -s -N -p1 -d "$$site" < $(DAGSTER_PATCH)
	@touch $@

data: $(VENV)/.installed  ## fetch (MovieLens) or generate (synthetic) the configured source's data
	$(VENV)/bin/hir prepare

# The source's instance (hir.toml's `source` or HIR_SOURCE): dagster_project.instance prints its folder, installing
# deploy/dagster.local.yaml there when it has no dagster.yaml, and refuses a folder marked for another source.
demo: $(VENV)/.installed data  ## materialise every window end to end, print a summary
	home="$$($(PY) -m dagster_project.instance)" && DAGSTER_HOME="$$home" $(PY) -m dagster_project.demo

# Tests make their own temporary instances: never the one in DAGSTER_HOME.
test: $(VENV)/.installed  ## the whole suite (CI runs this)
	HIR_SOURCE=movielens $(VENV)/bin/hir prepare
	env -u DAGSTER_HOME $(PY) -m pytest -q -ra

test-fast: $(VENV)/.installed  ## everything but the slow end-to-end tests
	env -u DAGSTER_HOME $(PY) -m pytest -q -m "not slow"

# The UI needs the source's data (its partitions are the data's windows): `data` fetches or generates it first.
# dagster_project.ui prints the source and instance it serves and stops `dagster dev` within 10 s on Ctrl-C.
ui: $(VENV)/.installed data  ## the Dagster UI on the source's instance (as `demo`), on 127.0.0.1 only
	$(PY) -m dagster_project.ui

bench: $(VENV)/.installed
	$(PY) benchmarks/ingest.py
	$(PY) benchmarks/graph.py

clean:
	rm -rf .hir
