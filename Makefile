# Every target sets up a local virtualenv first, so a fresh clone needs only python3.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test mutate rocketmq-jars agent-jar monitoring-tools bench demo demo-peers clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,metrics]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/zns serve $(ARGS)

# Four worker processes, each test file on one worker (module fixtures such as the interop
# JVMs start once): most of the suite waits on subprocesses, JVMs and timers, so more
# workers than cores finish it sooner on two cores (676 s of pytest with two, 504 with
# three; since the server tests run `zns serve`'s processes, 547 s with three against 487
# with four, measured from fresh clones). TEST_WORKERS=0 runs it in this process. Files are
# handed out longest first (tests/conftest.py's LONGEST_FIRST), not xdist's most-tests-first.
TEST_WORKERS ?= 4
test: $(STAMP) rocketmq-jars agent-jar monitoring-tools
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# The real RocketMQ jars for tests/interop (4.9.7, 5.3.3, 5.5.0: the version matrix), fetched
# once into a cache outside git (${ZNS_ROCKETMQ_CACHE:-~/.cache/zns}/rocketmq-VERSION, one line
# on stderr while Maven works); a second run only checks a stamp per version. Then one
# class-data sharing archive per JVM kind and version, made by a training run (about half a
# minute per version, once): the JVMs the tests start load their classes from it.
# Without java/javac/mvn it does nothing and the interop tests skip; a failed fetch is only
# a warning unless ZNS_REQUIRE_INTEROP=1.
rocketmq-jars:
	@if command -v java >/dev/null 2>&1 && command -v javac >/dev/null 2>&1 && command -v mvn >/dev/null 2>&1; then \
		$(PYTHON) tools/rocketmq/fetch.py >/dev/null || { \
			if [ "$${ZNS_REQUIRE_INTEROP:-0}" = 1 ]; then exit 1; fi; \
			echo "rocketmq-jars: fetch failed; the interop tests will skip" >&2; }; \
		$(PYTHON) tests/interop/rocketmq.py >/dev/null || \
			echo "rocketmq-jars: no class-data archives; the JVMs start without them" >&2; \
	else \
		echo "rocketmq-jars: no JDK/Maven on PATH; the interop tests will skip" >&2; \
	fi

# promtool, for tests/test_monitoring.py (the alert rules and the dashboard's queries): from
# Debian's prometheus package, installed here when it is missing and this is root on a system
# with apt-get (a minute, once; nothing when present). Otherwise those tests skip, unless
# ZNS_REQUIRE_INTEROP=1.
monitoring-tools:
	@if ! command -v promtool >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "monitoring-tools: installing Debian's prometheus package for promtool" >&2; \
			{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
				--no-install-recommends prometheus; } >/dev/null 2>&1 || \
				echo "monitoring-tools: could not install prometheus; the promtool tests will skip" >&2; \
		else \
			echo "monitoring-tools: no promtool; the promtool tests will skip" >&2; \
		fi; \
	fi

# zns-agent.jar (agent/, README "Pushed routes for existing Java applications"), built by
# Maven into a cache outside git ($ZNS_AGENT_CACHE or ~/.cache/zns/agent) once per version
# of its sources: a second run costs a hash. Without java/mvn it does nothing and the agent
# tests skip; a failed build is only a warning unless ZNS_REQUIRE_INTEROP=1.
agent-jar:
	@if command -v java >/dev/null 2>&1 && command -v mvn >/dev/null 2>&1; then \
		$(PYTHON) agent/build.py >/dev/null || { \
			if [ "$${ZNS_REQUIRE_INTEROP:-0}" = 1 ]; then exit 1; fi; \
			echo "agent-jar: build failed; the agent tests will skip" >&2; }; \
	else \
		echo "agent-jar: no JDK/Maven on PATH; the agent tests will skip" >&2; \
	fi

# Mutation testing of zns/core, zns/drivers and zns/cli, one module at a time with its own
# fast tests (tools/mutate.py; see docs/development.md). Installs the `mutate` extra (mutmut)
# on first use; writes docs/mutation-scores.md. MUTATE_ARGS="routes timers" runs some modules
# only. Hours for all.
$(VENV)/.mutate-installed: $(STAMP)
	$(BIN)/pip install --quiet -e '.[test,mutate]'
	touch $@

mutate: $(VENV)/.mutate-installed
	nice -n 19 $(BIN)/python tools/mutate.py $(MUTATE_ARGS)

# Every benchmark: prints a table, writes bench/results.md and .json. BENCH_ARGS="--quick"
# for a smoke run (under 4 minutes on 2 cores), or names to run only some (e.g. "scale").
bench: $(STAMP)
	$(BIN)/python -m bench.run_all $(BENCH_ARGS)

# A NameServer, two brokers in two clusters and a watcher; one broker stops and the
# pushed route change arrives. Exits by itself (bounded by a 60 s watchdog).
demo: $(STAMP)
	$(BIN)/python examples/demo.py

# Three NameServers with peer hints: a silent broker one of them expires leaves the other two
# a quarter of its heartbeat timeout later. tests/test_demos.py runs every demo* target.
demo-peers: $(STAMP)
	$(BIN)/python examples/peers_demo.py

clean:
	rm -rf $(VENV) build *.egg-info
