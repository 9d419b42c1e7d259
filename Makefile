# One command each: `make serve` and `make test` set up .venv themselves.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: serve test lint bench clean bytecode

$(STAMP): pyproject.toml setup.py $(wildcard broky/*/*.pyx) $(wildcard broky/*/*.pxd) vendor/xxhash/xxhash.h
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[dev]'
	touch $(STAMP)

# Every broker, worker and test process imports Broky's modules from
# source unless their bytecode is cached: with PYTHONDONTWRITEBYTECODE set
# (as on this machine) nothing caches it, and each process start compiled
# them all again (~5-9 s to a listening `broky serve` on a loaded 2-core
# machine, 4.6-5.4 s once cached). compileall writes the cache regardless and
# recompiles only what changed; a stale entry is never used (mtime check).
bytecode: $(STAMP)
	$(VENV)/bin/python -m compileall -q -j 0 broky benchmarks tests

serve: bytecode
	$(VENV)/bin/broky serve

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# The whole suite runs on the compiled hot path; the tests that drive the
# hot path run again on its pure-Python fallback (BROKY_PURE=1). The cluster
# tests start a real etcd (Debian's etcd-server); apt-get runs only when it is missing.
#
# Two pytest workers (one on a one-core machine), a test file each at a
# time: one worker used two-thirds of two cores (most tests wait on broker,
# etcd and Spark processes), and the main run took 14:54 against 8:53 with
# two. Whole files keep each module's fixtures (one etcd per worker, one
# bench run) from being set up twice.
PYTEST := $(VENV)/bin/pytest -q -n auto --maxprocesses 2 --dist loadfile
test: lint bytecode
	@command -v etcd >/dev/null || { apt-get update && apt-get install -y etcd-server; }
	$(PYTEST) --durations=20
	BROKY_PURE=1 $(PYTEST) tests/protocol tests/router tests/connection tests/integration \
		tests/client/test_decoding.py tests/storage/test_read_spans.py \
		tests/subscriptions/test_delivery.py tests/subscriptions/test_feed.py \
		tests/client/test_delivery_columns.py tests/subscriptions/test_message_slots.py \
		tests/subscriptions/test_passes.py tests/subscriptions/test_core.py \
		tests/subscriptions/test_settle_ranges.py \
		tests/subscriptions/test_dispatch_machine.py \
		tests/storage/test_runs_batch.py tests/storage/test_producer_batches.py

# The peers are Debian packages; apt-get runs only when a server binary is missing.
bench: bytecode
	@command -v nats-server >/dev/null && command -v redis-server >/dev/null || \
		{ apt-get update && apt-get install -y nats-server redis-server; }
	$(VENV)/bin/python -m benchmarks.bench_core $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
