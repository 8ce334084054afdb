# Kafka recovery ledger: developer entry points.
#
#   make demo      install the ledger and its testbed (two distributions, both
#                  editable; no dev tools), then run the demo (starts/reuses
#                  the local broker)
#   make check     lint, format check, types, layer rules, the docs build and
#                  the unit tests (no broker; about a minute)
#   make docs      the documentation site (docs/, mkdocs.yml) into .cache/site,
#                  --strict: a broken link or a page missing from the nav fails
#   make test      the whole suite: `make check`'s checks and the docs build,
#                  every test on the real broker, then the wheel check (the two built wheels,
#                  product and testbed, installed outside the checkout run `ledger demo --json`)
#   make mission   the 4,000-case fee-remediation mission with crashes everywhere
#   make mission-engine  the same mission as a LangGraph workflow (SQLite checkpoints),
#                  its worker SIGKILLed at every step, beside its direct-call control
#                  (CASES=, default 1000 here)
#   make mission-chaos  the same on three brokers with broker faults (root: netns)
#                  (CASES=, INSTANCES=, MODE=ledger|checkpoint-only to change it)
#   make bench     benchmarks against the bare Kafka limit and against peers
#                  (Quix Streams, DBOS in .venv-peers; Kafka Streams, a Java app
#                  Maven builds in bench/peers/kstreams): bench/results.json and
#                  bench/REPORT.md (RUNS=, BENCH_ARGS= to change it)
#   make kafka     fetch the broker jars into .cache/kafka/libs (Maven, once)
#   make wheel-check   only the wheel check
#   make console-screenshot  docs/console.png (+ -timeline.png) from the console's
#                  browser test (needs chromium and chromedriver)
#
# Needs python3 (3.11+), Java 17+ and Maven for the local broker; or Docker
# (`docker compose up -d`, then KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:19092).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.DEFAULT_GOAL := test
.PHONY: venv venv-run kafka demo docs mission mission-engine mission-chaos mission-compare bench check test wheel-check console-screenshot lint fmt broker-start broker-stop broker-status clean distclean

# Two stamps in one virtualenv: the runtime with its testbed (what the demo
# and missions need), and the developer tools on top (what the tests need).
# The testbed is a distribution of its own (testbed/pyproject.toml, which the
# product's wheel does not carry): the product is installed first, then the
# testbed on top of it, both editable. Each stamp re-installs only when a
# pyproject.toml changes; pip's pages of output go to $(VENV)/install.log and
# are shown only when an install fails.
PYPROJECTS := pyproject.toml testbed/pyproject.toml
RUN_STAMP := $(VENV)/.installed-run
DEV_STAMP := $(VENV)/.installed-dev

venv: $(DEV_STAMP)
venv-run: $(RUN_STAMP)

$(RUN_STAMP): $(PYPROJECTS)
	@echo "installing the ledger and its testbed into $(VENV) (first run: a minute) ..."
	@[ -x $(BIN)/python ] || $(PYTHON) -m venv $(VENV)
	@$(BIN)/pip install --upgrade --quiet pip > $(VENV)/install.log 2>&1 \
	  && $(BIN)/pip install --quiet -e . >> $(VENV)/install.log 2>&1 \
	  && $(BIN)/pip install --quiet -e ./testbed >> $(VENV)/install.log 2>&1 \
	  || { tail -n 30 $(VENV)/install.log; exit 1; }
	@touch $@

$(DEV_STAMP): $(RUN_STAMP)
	@echo "installing the developer tools into $(VENV) ..."
	@$(BIN)/pip install --quiet -e '.[dev]' >> $(VENV)/install.log 2>&1 \
	  && $(BIN)/pip install --quiet -e ./testbed >> $(VENV)/install.log 2>&1 \
	  || { tail -n 30 $(VENV)/install.log; exit 1; }
	@touch $@

kafka: venv-run
	@$(BIN)/ledger broker fetch

demo: venv-run kafka
	$(BIN)/ledger demo

CASES     ?= 4000
INSTANCES ?= 1
MODE      ?= ledger

mission: venv-run kafka
	$(BIN)/ledger mission run --cases $(CASES) --crash-rate 0.05 --seed 7 \
		--instances $(INSTANCES) --mode $(MODE)

# The mission as a LangGraph workflow per case, its worker killed at every
# step and resumed from its SQLite checkpoints; the ledger beside a control
# whose nodes call the sinks directly.
mission-engine: venv-run kafka
	@$(BIN)/pip install --quiet -e './testbed[engine-mission]' >> $(VENV)/install.log 2>&1 \
	  || { tail -n 30 $(VENV)/install.log; exit 1; }
	$(BIN)/python -m testbed.engine_mission --cases $(if $(filter file,$(origin CASES)),1000,$(CASES))

# The same mission on a local three-broker cluster in network namespaces of
# its own, with the leader, the controller, rolling and full restarts and a
# partition hitting the cluster while it runs (needs root for `ip netns`).
mission-chaos: venv-run kafka
	$(BIN)/ledger mission run --cases $(CASES) --crash-rate 0.05 --seed 11 \
		--instances $(INSTANCES) --brokers 3 --broker-chaos

mission-compare: venv-run kafka
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

# The Kafka Streams peer: its jar is its stamp, rebuilt when its sources change.
# Without Maven it is skipped and the peer reports an error in the results.
KSTREAMS_DIR := bench/peers/kstreams
KSTREAMS_JAR := $(KSTREAMS_DIR)/target/kstreams-peer.jar

$(KSTREAMS_JAR): $(KSTREAMS_DIR)/pom.xml $(shell find $(KSTREAMS_DIR)/src -type f 2>/dev/null)
	@if command -v mvn > /dev/null; then \
	  echo "building the Kafka Streams peer ($@) with Maven ..."; \
	  (cd $(KSTREAMS_DIR) && mvn -q -B package) && touch $@; \
	else \
	  echo "no mvn on PATH: the Kafka Streams peer is skipped (it reports an error)"; \
	fi

$(BENCH_STAMP): $(DEV_STAMP)
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	touch $@

bench: venv kafka $(BENCH_STAMP) $(PEERS_STAMP) $(KSTREAMS_JAR)
	$(BIN)/ledger broker start
	$(BIN)/python -m bench --runs $(RUNS) $(BENCH_ARGS)

MYPY_PATHS := ledger consumers producers sinks testbed bench docs/gen_config.py

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy $(MYPY_PATHS)
	$(BIN)/lint-imports

check: lint docs
	$(BIN)/pytest -q tests/unit

# The documentation site, built strictly (mkdocs.yml's validation turns a
# broken link, a missing anchor and a page left out of the nav into warnings,
# --strict into failures); first the configuration reference must match the
# settings class it is generated from (docs/gen_config.py writes it).
DOCS_DIR := .cache/site

docs: venv
	@$(BIN)/python docs/gen_config.py --check
	$(BIN)/mkdocs build --strict --quiet -d $(DOCS_DIR)

# The suite in two parts at once: everything but the `chaos` tests in
# $(TEST_WORKERS) processes (pytest-xdist; a test's waits on the broker leave
# the cores mostly idle, and a test that stops or restarts its broker has one
# of its own), and beside them, in one more process, the `chaos` ones (the
# mission on a three-node cluster of its own, which takes minutes); its
# output is printed after the first part's. The local broker is started first
# and stopped at the end unless it was running before. `pytest` alone runs
# everything but the chaos mission in one process (`pytest -m chaos` runs it).
TEST_WORKERS ?= 2
BESIDE_LOG   := .cache/tests-beside.log
PYTEST_PHASES = mkdir -p .cache; \
	( $(BIN)/pytest -m chaos --durations=10 > $(BESIDE_LOG) 2>&1 \
	  && { [ -n "$$KAFKA_BOOTSTRAP_SERVERS" ] \
	       || $(MAKE) --no-print-directory wheel-check >> $(BESIDE_LOG) 2>&1; } ) & beside=$$!; \
	$(BIN)/pytest -n $(TEST_WORKERS) -m "not chaos" --durations=15; main_rc=$$?; \
	wait $$beside; beside_rc=$$?; \
	echo "--- beside them: pytest -m chaos, then the wheel check (exit $$beside_rc) ---"; \
	cat $(BESIDE_LOG); \
	[ $$main_rc = 0 ] && [ $$beside_rc = 0 ]

test: lint docs kafka
	@if [ -n "$$KAFKA_BOOTSTRAP_SERVERS" ]; then $(PYTEST_PHASES); exit $$?; fi; \
	was_up=0; $(BIN)/ledger broker status > /dev/null 2>&1 && was_up=1; \
	$(BIN)/ledger broker start > /dev/null || exit 1; \
	$(PYTEST_PHASES); rc=$$?; \
	[ $$was_up = 1 ] || $(BIN)/ledger broker stop > /dev/null; exit $$rc

# The wheels as a user gets them: the product's and the testbed's, built from
# the checkout and checked (.ci/wheel_contents.py: the product's holds no
# testbed module, the testbed's holds itself and its data), installed together
# into a fresh virtualenv outside the checkout (one folder per checkout under
# $TMPDIR), and run from an empty folder there, so nothing can resolve to the
# checkout; the broker jars are the checkout's. `ledger demo` exits 1 unless
# every value of its report is the expected one.
WHEEL_DIR ?= $(or $(TMPDIR),/tmp)/ledger-wheel-check-$(shell printf '%s' "$(CURDIR)" | cksum | cut -d' ' -f1)

# Its broker is its own (a folder of its own, the checkout's jars, on
# LEDGER_KAFKA_PORT + 60), so `make test` runs it beside the suite.
WHEEL_KAFKA_PORT ?= $(shell echo $$(( $${LEDGER_KAFKA_PORT:-19092} + 60 )))

wheel-check: venv kafka
	@rm -rf $(WHEEL_DIR) && mkdir -p $(WHEEL_DIR)/dist $(WHEEL_DIR)/home $(WHEEL_DIR)/kafka
	@ln -s $(CURDIR)/.cache/kafka/libs $(WHEEL_DIR)/kafka/libs
	@echo "wheel check: building the product's and the testbed's wheels ..."
	@{ $(BIN)/pip wheel --quiet --no-deps -w $(WHEEL_DIR)/dist . \
	   && $(BIN)/pip wheel --quiet --no-deps -w $(WHEEL_DIR)/dist ./testbed; } \
	  > $(WHEEL_DIR)/build.log 2>&1 || { tail -n 30 $(WHEEL_DIR)/build.log; exit 1; }
	@rm -rf testbed/build  # setuptools' staging copy of the package, not a second source tree
	$(BIN)/python .ci/wheel_contents.py $(WHEEL_DIR)/dist/kafka_recovery_ledger-*.whl \
	  $(WHEEL_DIR)/dist/kafka_recovery_ledger_testbed-*.whl
	@echo "wheel check: installing $$(ls $(WHEEL_DIR)/dist | tr '\n' ' ')into $(WHEEL_DIR)/venv ..."
	@$(PYTHON) -m venv $(WHEEL_DIR)/venv
	@$(WHEEL_DIR)/venv/bin/pip install --quiet $(WHEEL_DIR)/dist/*.whl \
	  > $(WHEEL_DIR)/install.log 2>&1 || { tail -n 30 $(WHEEL_DIR)/install.log; exit 1; }
	@echo "wheel check: ledger demo --json from $(WHEEL_DIR)/home ..."
	cd $(WHEEL_DIR)/home && export LEDGER_HOME=$(WHEEL_DIR)/home LEDGER_KAFKA_HOME=$(WHEEL_DIR)/kafka \
	  LEDGER_KAFKA_PORT=$(WHEEL_KAFKA_PORT); $(WHEEL_DIR)/venv/bin/ledger demo --json > demo.json; \
	  rc=$$?; $(WHEEL_DIR)/venv/bin/ledger broker stop > /dev/null 2>&1; exit $$rc
	@echo "wheel check: passed (report in $(WHEEL_DIR)/home/demo.json)"

# The README's console screenshots, taken by the browser test on its real ledger.
console-screenshot: venv kafka
	LEDGER_REQUIRE_BROWSER=1 LEDGER_CONSOLE_SCREENSHOT=$(CURDIR)/docs/console.png \
	  $(BIN)/pytest -q tests/integration/test_console.py

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
	rm -rf .pytest_cache .mypy_cache .ruff_cache .hypothesis build dist *.egg-info \
	  testbed/build testbed/*.egg-info
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -exec rm -rf {} +

# Everything generated: also stops our broker, removes the venv, jars and data.
distclean: clean
	-[ -x $(BIN)/ledger ] && $(BIN)/ledger broker stop
	rm -rf $(VENV) $(PEERS) .cache .ledger build $(WHEEL_DIR) $(KSTREAMS_DIR)/target
