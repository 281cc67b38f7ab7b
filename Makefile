# The two commands of the README: `make demo` and `make test`. Each creates .venv and installs
# what it needs on a machine that has only Python >= 3.11.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
EXTRAS := kafka,rabbitmq,sqlalchemy,embedded,otel,metrics,dev
STAMP := $(VENV)/.installed

.PHONY: venv demo test lint typecheck pytest bench chaos clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' || \
		{ echo "relayer needs Python >= 3.11; found: $$($(PYTHON) --version 2>&1)"; exit 2; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[$(EXTRAS)]'
	@touch $@

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/relayer demo

lint: $(STAMP)
	$(BIN)/ruff check relayer tests bench
	$(BIN)/ruff format --check relayer tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/pytest

test: lint typecheck pytest

bench: $(STAMP)
	$(BIN)/python bench/writer.py
	$(BIN)/python bench/relay.py
	$(BIN)/python bench/dispatch.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache build *.egg-info
