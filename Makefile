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

.PHONY: serve test test-fast lint docs image setup clean bench lock

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

test: image lint docs
	$(BIN)/python -m pytest $(ARGS)

test-fast: setup
	$(BIN)/python -m pytest tests/unit -q $(ARGS)

# The reference in docs/, built with MkDocs (Material); --strict fails on a broken link.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

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

clean:
	rm -rf $(VENV) .lock-venv .mypy_cache .ruff_cache .pytest_cache test-output
