# Kafka recovery ledger: developer entry points.
#
#   make test      venv + broker jars, then lint, format check, mypy and pytest
#                  (the tests start the local broker themselves, or use
#                  KAFKA_BOOTSTRAP_SERVERS when it is set)
#   make demo      run the demo (starts/reuses the local broker)
#   make mission   the 4,000-case fee-remediation mission with crashes everywhere
#                  (CASES=, INSTANCES=, MODE=ledger|checkpoint-only to change it)
#   make bench     benchmarks against the bare Kafka limit and against peers
#                  (Quix Streams, DBOS in .venv-peers): bench/results.json and
#                  bench/REPORT.md (RUNS=, BENCH_ARGS= to change it)
#   make kafka     fetch the broker jars into .cache/kafka/libs (Maven, once)
#
# Needs python3 (3.11+), Java 17+ and Maven for the local broker; or Docker
# (`docker compose up -d`, then KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:19092).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.DEFAULT_GOAL := test
.PHONY: venv kafka demo mission mission-compare bench test lint fmt broker-start broker-stop broker-status clean distclean

venv: $(STAMP)

# Re-install only when the project's dependencies change.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade --quiet pip
	$(BIN)/pip install -e '.[dev]'
	touch $@

kafka: venv
	$(BIN)/ledger broker fetch

demo: venv kafka
	$(BIN)/ledger demo

CASES     ?= 4000
INSTANCES ?= 1
MODE      ?= ledger

mission: venv kafka
	$(BIN)/ledger mission run --cases $(CASES) --crash-rate 0.05 --seed 7 \
		--instances $(INSTANCES) --mode $(MODE)

mission-compare: venv kafka
	$(BIN)/ledger mission compare --cases $(CASES) --crash-rate 0.05 --seed 7 \
		--instances $(INSTANCES)

# The peers live in their own virtualenv: Quix Streams pins an older
# confluent-kafka than the project's.
PEERS       := .venv-peers
PEERS_STAMP := $(PEERS)/.installed
BENCH_STAMP := $(VENV)/.bench-installed
RUNS        ?= 3
BENCH_ARGS  ?=

$(PEERS_STAMP): pyproject.toml bench/peers/requirements.txt
	$(PYTHON) -m venv $(PEERS)
	$(PEERS)/bin/pip install --upgrade --quiet pip
	$(PEERS)/bin/pip install --quiet -e . -r bench/peers/requirements.txt
	touch $@

$(BENCH_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	touch $@

bench: venv kafka $(BENCH_STAMP) $(PEERS_STAMP)
	$(BIN)/ledger broker start
	$(BIN)/python -m bench --runs $(RUNS) $(BENCH_ARGS)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy ledger consumers producers sinks bench

test: venv kafka
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy ledger consumers producers sinks bench
	$(BIN)/pytest

fmt: venv
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

broker-start: venv kafka
	$(BIN)/ledger broker start

broker-stop: venv
	$(BIN)/ledger broker stop

broker-status: venv
	$(BIN)/ledger broker status

# Build and tool caches only; the venv, broker jars and broker data stay.
clean:
	rm -rf .pytest_cache .mypy_cache .ruff_cache .hypothesis build dist *.egg-info
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -exec rm -rf {} +

# Everything generated: also stops our broker, removes the venv, jars and data.
distclean: clean
	-[ -x $(BIN)/ledger ] && $(BIN)/ledger broker stop
	rm -rf $(VENV) $(PEERS) .cache .ledger
