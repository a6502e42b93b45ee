# Paddock — the README's two commands are `make run` and `make test`. Both set everything up first.
SHELL := /bin/bash
VENV  ?= .venv
PY    := $(VENV)/bin/python
PIP   := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
export PADDOCK_DATA_DIR ?= /var/lib/paddock
export PADDOCK_HOST_IMAGE_DIR ?= $(PADDOCK_DATA_DIR)/images
export PADDOCK_TEST_IMAGE_CACHE ?= $(PADDOCK_HOST_IMAGE_DIR)
# mypy's incremental cache outside the checkout: CI checks out afresh each time, and the full check of src
# from nothing took ~70 s of every run (mypy compares each module's hash, so a new checkout's mtimes
# change nothing). One directory per option set: strict and non-strict runs would overwrite each other.
MYPY_CACHE ?= /var/cache/paddock/mypy

.PHONY: run test setup setup-test venv images devchain-deps e2b-js-deps console-assets lint bench bench-smoke bench-deps clean soak

run: setup images devchain-deps console-assets
	$(VENV)/bin/paddock serve

test: setup-test images devchain-deps console-assets
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench
	$(VENV)/bin/mypy --cache-dir $(MYPY_CACHE)/default src
	$(VENV)/bin/mypy --cache-dir $(MYPY_CACHE)/strict --strict src/paddock
	$(PY) scripts/unasync.py --check
	@export PADDOCK_TEST_PG_URL="$$(scripts/ensure-postgres.sh)"; scripts/run-tests.sh $(PYTEST_ARGS)

setup:
	scripts/setup-host.sh
	@$(MAKE) --no-print-directory venv

setup-test:
	scripts/setup-host.sh --test
	@$(MAKE) --no-print-directory venv
	@$(MAKE) --no-print-directory e2b-js-deps

# The E2B JS SDKs the tests run unmodified (tests/e2b/test_edge_js.py), as pinned by their lock file.
e2b-js-deps:
	@if [ -f tests/e2b/js/package.json ] && command -v npm >/dev/null; then \
	  (cd tests/e2b/js && { [ -d node_modules ] && [ node_modules -nt package-lock.json ] || npm ci --no-audit --no-fund --loglevel=error; }); \
	fi

# Reinstall only when the dependency list changes.
venv: $(STAMP)
# constraints.txt pins the whole tree, so that a new machine installs what the last full run passed with.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt -e '.[test]'
	touch $(STAMP)

# debian:13 (~10 s) for sandboxes; devbox:1 (~60-100 s once: python3, node, build tools) for gateway deployments;
# desktop:1 (~55 s once: Xvfb, Openbox, Chromium, noVNC) for computer use.
images: venv
	@if $(PY) -c 'import paddock_hostagent.images' 2>/dev/null; then \
	  $(PY) -m paddock_hostagent.images build debian:13; \
	  $(PY) -m paddock_hostagent.images build devbox:1; \
	  $(PY) -m paddock_hostagent.images build code-interpreter:1; \
	  $(PY) -m paddock_hostagent.images build desktop:1; \
	fi

# The web console's browser files (xterm.js) from npm, copied into the package (git-ignored build output,
# docs/console.md); never fetched from a CDN at run time. Reinstalled only when the lock file changes.
console-assets:
	@if [ -f console/package.json ] && command -v npm >/dev/null; then \
	  (cd console && { [ -d node_modules ] && [ node_modules -nt package-lock.json ] || npm ci --no-audit --no-fund --loglevel=error; } && node copy-vendor.mjs >/dev/null); \
	fi

devchain-deps:
	@if [ -f devchain/package.json ]; then \
	  (cd devchain && { [ -d node_modules ] && [ node_modules -nt package-lock.json ] || npm ci --no-audit --no-fund --loglevel=error; }); \
	fi

# The long fork torture (200 seeded sequences; PADDOCK_TORTURE_SEED / PADDOCK_TORTURE_ITERATIONS to change).
soak: setup-test images
	@export PADDOCK_TEST_PG_URL="$$(scripts/ensure-postgres.sh)"; \
	PADDOCK_SOAK=1 $(PY) -m pytest -p no:cacheprovider -s -m slow tests/hostagent/test_fork_torture.py $(PYTEST_ARGS)

# The sync SDK (and the sync twins of the live SDK tests) are generated from the async sources.
lint: venv
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench
	$(VENV)/bin/mypy --cache-dir $(MYPY_CACHE)/default src
	$(PY) scripts/unasync.py --check

# Benchmarks never fail on a time; they fail only when a section cannot run. Results: bench/results/.
bench: setup bench-deps images
	$(PY) -m bench.run $(BENCH_ARGS)

bench-smoke: bench-deps images
	$(PY) -m bench.run --smoke $(BENCH_ARGS)

# The peer (podman) and the load tool (wrk) from Debian packages; idempotent.
bench-deps:
	scripts/setup-host.sh --bench
	@$(MAKE) --no-print-directory venv

clean:
	rm -rf $(VENV) .pytest_cache
