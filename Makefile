# Every target sets up a local virtualenv first, so a fresh clone needs only python3.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test bench demo demo-peers clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/zns serve $(ARGS)

test: $(STAMP)
	$(BIN)/pytest $(PYTEST_ARGS)

# Every benchmark (about 10 minutes): prints a table, writes bench/results.md and .json.
# BENCH_ARGS="--quick" for a smoke run, or names to run only some (e.g. "scale").
bench: $(STAMP)
	$(BIN)/python -m bench.run_all $(BENCH_ARGS)

# A NameServer, two brokers in two clusters and a watcher; one broker stops and the
# pushed route change arrives. Exits by itself (bounded by a 60 s watchdog).
demo: $(STAMP)
	$(BIN)/python examples/demo.py

# Three NameServers with peer hints: a silent broker leaves all three within the grace.
demo-peers: $(STAMP)
	$(BIN)/python examples/peers_demo.py

clean:
	rm -rf $(VENV) build *.egg-info
