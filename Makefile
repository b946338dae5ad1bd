# Every target sets up a local virtualenv first, so a fresh clone needs only python3.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test bench demo clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/zns serve $(ARGS)

test: $(STAMP)
	$(BIN)/pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
