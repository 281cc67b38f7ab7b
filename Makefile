# The two commands of the README: `make demo` and `make test`. Each creates .venv and installs
# what it needs on a machine that has only Python >= 3.11.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
EXTRAS := kafka,rabbitmq,nats,redis,webhooks,sqs,sqlalchemy,embedded,otel,metrics,dashboard,dev
STAMP := $(VENV)/.installed

.PHONY: venv demo test lint typecheck pytest wheel-check docs docs-serve bench chaos clean

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
	$(BIN)/ruff check relayer tests bench examples scripts
	$(BIN)/ruff format --check relayer tests bench examples scripts

typecheck: $(STAMP)
	$(BIN)/mypy

# Two test processes (pytest-xdist), a file each at a time: most tests wait on a database, a
# broker or a subprocess, so two keep both cores busy. PYTEST_WORKERS=0 runs them in one process.
PYTEST_WORKERS ?= 2
pytest: $(STAMP)
	$(BIN)/pytest $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile)

# Build the sdist and wheel from the files a clone has, install the wheel in a fresh venv and
# run its `relayer` command (about 20 s).
wheel-check: $(STAMP)
	$(BIN)/python scripts/wheel_check.py

# The documentation site (mkdocs.yml): strict, so a broken link or anchor fails the build.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --dev-addr 127.0.0.1:8000

test: lint typecheck docs wheel-check pytest

bench: $(STAMP)
	$(BIN)/python bench/writer.py
	$(BIN)/python bench/relay.py
	$(BIN)/python bench/dispatch.py

# Every fault-injection scenario of tests/chaos, in both storage modes (about 20 minutes;
# STORAGE=delete or STORAGE=partitioned runs one mode; `make test` runs a smoke subset).
# The clock-skew scenario preloads libfaketime, the PgBouncer ones run Debian's pgbouncer: each
# installed here when missing and apt-get can run (as root), otherwise those scenarios skip.
STORAGE ?= both
chaos: $(STAMP)
	@ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1 || \
		{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		  { apt-get install -y -qq libfaketime >/dev/null 2>&1 || \
		    { apt-get update -qq >/dev/null && apt-get install -y -qq libfaketime >/dev/null; }; }; } || \
		echo "libfaketime is not installed: the clock-skew scenario will be skipped"
	@command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] || \
		{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		  { apt-get install -y -qq pgbouncer >/dev/null 2>&1 || \
		    { apt-get update -qq >/dev/null && apt-get install -y -qq pgbouncer >/dev/null; }; }; } || \
		echo "pgbouncer is not installed: the PgBouncer scenarios will be skipped"
	$(BIN)/pytest -m chaos tests/chaos --storage $(STORAGE)

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache build dist site *.egg-info
