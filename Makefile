# The two commands a newcomer needs:
#   make serve   set up, build the kernel image if Docker answers, and start the gateway
#   make test    set up, build the kernel image if Docker answers, lint, type-check, check the
#                layers, build the docs, run every test
# While working: make test-fast runs the unit tier (tests/unit/: no server, no Docker) in seconds.
# Both create ./.venv on first use; nothing is installed outside it.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
ARGS   ?=

.PHONY: serve test test-fast lint docs docs-config image setup clean bench lock lock-py311 e2b-sdks e2b-suite e2b-js-suite

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[server,test]'
	touch $@

# Builds (or, with nothing changed, refreshes from cache in a few seconds) the kernel image
# when a Docker engine answers.
image: setup
	@if docker info >/dev/null 2>&1; then \
		$(BIN)/kernel-gateway build-image; \
	else \
		echo "no Docker engine answers: skipping the kernel image (the local backend will be used)"; \
	fi

serve: setup
	-@$(MAKE) --no-print-directory image
	$(BIN)/kernel-gateway serve $(ARGS)

lint: setup
	$(BIN)/ruff check kernel_gateway tests bench
	$(BIN)/ruff format --check kernel_gateway tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

# Two pytest-xdist workers, a test file per unit (tests/support/scheduling.py, docs/testing.md);
# TEST_WORKERS=0 runs pytest in one process.
TEST_WORKERS ?= 2

test: image lint docs e2b-sdks e2b-suite e2b-js-suite
	$(BIN)/python -m pytest $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile) $(ARGS)

test-fast: setup
	$(BIN)/python -m pytest tests/unit -q $(ARGS)

# E2B's other SDKs for tests/integration/test_e2b_sdks.py (the newest Python SDK is in .venv): the oldest
# Python SDK that honours E2B_SANDBOX_URL in a venv of its own, and the JavaScript SDK with
# npm (skipped, and its test with it, where Node.js is missing).
E2B_OLDEST := build/e2b-sdks/python-oldest
E2B_JS     := tests/integration/e2b_sdk/js

e2b-sdks: $(E2B_OLDEST)/.installed $(E2B_JS)/node_modules/.installed

$(E2B_OLDEST)/.installed: tests/integration/e2b_sdk/requirements-oldest.txt
	$(PYTHON) -m venv $(E2B_OLDEST)
	$(E2B_OLDEST)/bin/python -m pip install --quiet -r tests/integration/e2b_sdk/requirements-oldest.txt
	touch $@

$(E2B_JS)/node_modules/.installed: $(E2B_JS)/package.json $(E2B_JS)/package-lock.json
	@if command -v npm >/dev/null 2>&1; then \
		cd $(E2B_JS) && npm ci --no-audit --no-fund --loglevel=error && touch node_modules/.installed; \
	else \
		echo "no npm: skipping E2B's JavaScript SDK (its test will be skipped)"; \
	fi

# E2B's own tests (tests/e2b_suite/, vendored unchanged) need the SDK they were written for:
# tests/integration/test_e2b_suite.py and test_e2b_sandbox_suite.py run them with this venv.
E2B_SUITE := build/e2b-sdks/python-suite

e2b-suite: $(E2B_SUITE)/.installed

$(E2B_SUITE)/.installed: tests/e2b_suite/requirements.txt
	$(PYTHON) -m venv $(E2B_SUITE)
	$(E2B_SUITE)/bin/python -m pip install --quiet -r tests/e2b_suite/requirements.txt
	touch $@

# E2B's JavaScript SDK's tests (tests/e2b_suite/js/, with the SDK's source, vendored unchanged)
# need vitest and msw, and the SDK's own dependencies: tests/integration/test_e2b_js_suite.py.
E2B_JS_SUITE := tests/e2b_suite/js

e2b-js-suite: $(E2B_JS_SUITE)/node_modules/.installed

$(E2B_JS_SUITE)/node_modules/.installed: $(E2B_JS_SUITE)/package.json $(E2B_JS_SUITE)/package-lock.json
	@if command -v npm >/dev/null 2>&1; then \
		cd $(E2B_JS_SUITE) && npm ci --no-audit --no-fund --loglevel=error && touch node_modules/.installed; \
	else \
		echo "no npm: skipping E2B's JavaScript suite (its test will be skipped)"; \
	fi

# The reference in docs/, built with MkDocs (Material); --strict fails on a broken link.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# The settings tables of docs/*.md (between <!-- settings:NAME:begin/end --> markers), made
# from the settings' declarations; tests/unit/test_settings_declared.py fails when they are stale.
docs-config: setup
	$(BIN)/python -m kernel_gateway.cli.settings_doc

# Speed figures (docker backend): prints a table, writes bench/results/latest.json.
bench: image
	$(BIN)/python bench/run.py $(ARGS)

# Re-resolves kernel-image/requirements.lock from requirements.in with pip-tools, for the
# image's Python (3.13), against PyPI alone. ARGS=--upgrade moves every pin to the newest.
LOCK_PYTHON ?= python3.13
lock:
	$(LOCK_PYTHON) -m venv .lock-venv
	.lock-venv/bin/python -m pip install --quiet pip-tools
	cd kernel-image && env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL -u PIP_INDEX_URL \
		PIP_CONFIG_FILE=/dev/null ../.lock-venv/bin/pip-compile --generate-hashes \
		--allow-unsafe --strip-extras --no-emit-index-url --no-emit-find-links --quiet \
		$(ARGS) -o requirements.lock requirements.in

# Re-resolves kernel-image/requirements-py311.lock, the Python 3.11 image's (build-image
# --languages python3.11): requirements.lock's pins, moved only where one does not install on
# Debian 12's Python 3.11.2 (its /usr/bin/python3.11, needed here: the exact version matters).
LOCK311_PYTHON ?= /usr/bin/python3.11
lock-py311:
	$(LOCK311_PYTHON) -m venv .lock-venv-py311
	.lock-venv-py311/bin/python -m pip install --quiet pip-tools
	cd kernel-image && cp requirements.lock requirements-py311.lock && \
		env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL -u PIP_INDEX_URL \
		PIP_CONFIG_FILE=/dev/null ../.lock-venv-py311/bin/pip-compile --generate-hashes \
		--allow-unsafe --strip-extras --no-emit-index-url --no-emit-find-links --quiet \
		$(ARGS) -o requirements-py311.lock requirements.in

clean:
	rm -rf $(VENV) .lock-venv .lock-venv-py311 .mypy_cache .ruff_cache .pytest_cache test-output
