# pipeboard: `make up` serves it, `make test` tests it. Both create .venv on first use.

# Python 3.11 (torch 2.13.0's CPU wheel on these machines is built for it); else python3.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000
WORKERS ?= 1

.PHONY: up test bench install migrate clean-data

# Reinstall when the dependencies change; -c pins the versions the suite passed with.
$(INSTALLED): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[test]'
	# Bytecode for our own sources, as pip writes it for installed packages: where
	# PYTHONDONTWRITEBYTECODE is set (these machines) every command would compile them again.
	$(BIN)/python -m compileall -q app trainer
	touch $(INSTALLED)

install: $(INSTALLED)

up: $(INSTALLED)
	$(BIN)/pipeboard up --host $(HOST) --port $(PORT) --workers $(WORKERS)

# Two pytest processes (pytest-xdist), a test file each at a time: much of the suite waits on
# servers, workers and browsers it starts, and each file's fixtures (a deployment, a browser) stay
# in one process. Tests keep to their own database schemas, Redis key prefixes and ports already.
TEST_PROCESSES ?= 2

test: $(INSTALLED)
	$(BIN)/pytest --numprocesses $(TEST_PROCESSES) --dist loadfile $(PYTEST_ARGS)

migrate: $(INSTALLED)
	$(BIN)/pipeboard migrate

bench: $(INSTALLED)
	@for script in bench/*.py; do echo "== $$script"; $(BIN)/python $$script || exit 1; done

clean-data:
	rm -rf data
