# The few targets a newcomer needs. Each creates .venv and installs what it needs first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
## The tested set of every dependency (make lock writes it from pyproject.toml's ranges).
LOCK   := deploy/constraints.txt

.PHONY: lock demo test test-fast reliability lint bench bench-aio worker flower clean

$(STAMP): pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c $(LOCK) -e '.[test]'
	touch $(STAMP)

## demo: review the example batch on the embedded default (no Redis, no API keys needed)
demo: $(STAMP)
	$(BIN)/duet run examples/review.toml --input examples/inputs.jsonl --output results.jsonl

## test: the whole suite, TEST_WORKERS processes at a time (pytest-xdist); each starts its
## own Redis servers on free ports and never touches one it did not start
## (two per core: the suite mostly waits on servers and subprocesses)
TEST_WORKERS ?= $(shell $(PYTHON) -c 'import os; print(max(2, 2 * (os.cpu_count() or 1)))')
test: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup

## test-fast: pure and Redis-logic tests only
test-fast: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup tests/pure tests/redis

## reliability: every fault and bad-input test (those that record a row), then
## docs/RELIABILITY.md rendered from their rows (a failed test shows there as failed)
reliability: $(STAMP)
	$(BIN)/python -m pytest -rA -m reliability tests; status=$$?; \
	  $(BIN)/python -m tests.reliability render && exit $$status

lint: $(STAMP)
	$(BIN)/ruff check orchestration workers duet tests bench
	$(BIN)/ruff format --check orchestration workers duet tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

## bench: every benchmark in one run (~15 min), written to bench/RESULTS.md; the in-process
## reference (loomflow) goes in its own venv, bench/.venv-ref (the run says so if it cannot)
REF_VENV ?= bench/.venv-ref
bench: $(STAMP)
	-test -f $(REF_VENV)/.installed || ($(PYTHON) -m venv $(REF_VENV) && \
	  $(REF_VENV)/bin/python -m pip install --quiet 'loomflow==0.20.0' 'openai>=1.40,<4' && \
	  touch $(REF_VENV)/.installed)
	DUET_BENCH_REF_PYTHON=$(abspath $(REF_VENV))/bin/python $(BIN)/python -m bench.suite

## bench-aio: celery-aio-pool against the threads pool (bench/aio_pool.py); the package goes
## in its own venv, bench/.venv-aio (it is not a Duet dependency)
AIO_VENV ?= bench/.venv-aio
bench-aio: $(STAMP)
	test -f $(AIO_VENV)/.installed || ($(PYTHON) -m venv $(AIO_VENV) && \
	  $(AIO_VENV)/bin/python -m pip install --quiet 'celery[redis]>=5.7,<5.8' \
	    'celery-aio-pool==0.1.0rc8' && touch $(AIO_VENV)/.installed)
	$(BIN)/python -m bench.aio_pool --aio-python $(AIO_VENV)/bin/python

## worker: one worker process on DUET_REDIS_URL (all queues)
worker: $(STAMP)
	$(BIN)/duet worker

## flower: the Celery dashboard on http://localhost:5555 for DUET_REDIS_URL (loopback; login in FLOWER_BASIC_AUTH)
flower: $(STAMP)
	$(BIN)/duet flower --port=5555

## lock: re-resolve deploy/constraints.txt, the versions the image, `make test` and CI
## install, from pyproject.toml's ranges (every extra; Python 3.10 to 3.13)
lock: $(STAMP)
	$(BIN)/python -m pip install --quiet 'uv>=0.5'
	$(BIN)/uv pip compile pyproject.toml --extra test --extra otel --extra docs --extra all \
	  --universal --python-version 3.10 --no-header --annotation-style line -o $(LOCK)

clean:
	rm -rf $(VENV) bench/.venv-ref bench/.venv-aio results.jsonl .pytest_cache .ruff_cache .mypy_cache .reliability
