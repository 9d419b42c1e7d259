# One command each: `make serve` and `make test` set up .venv themselves.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: serve test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[dev]'
	touch $(STAMP)

serve: $(STAMP)
	$(VENV)/bin/broky serve

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# The cluster tests start a real etcd (Debian's etcd-server); apt-get runs only when it is missing.
test: lint
	@command -v etcd >/dev/null || { apt-get update && apt-get install -y etcd-server; }
	$(VENV)/bin/pytest -q

# The peers are Debian packages; apt-get runs only when a server binary is missing.
bench: $(STAMP)
	@command -v nats-server >/dev/null && command -v redis-server >/dev/null || \
		{ apt-get update && apt-get install -y nats-server redis-server; }
	$(VENV)/bin/python -m benchmarks.bench_core $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
