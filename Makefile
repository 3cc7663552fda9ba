# Two entry points for a fresh machine with only Python: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
# The CPU build; on these machines it is served from a local folder. Override on other hosts.
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin

.PHONY: demo test test-fast lint clean

$(BIN)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e '.[all,test,lint]'
	touch $@

demo: $(BIN)/.installed
	$(BIN)/edgetrain demo

test: $(BIN)/.installed
	$(BIN)/python -m pytest -q -n 2 --dist worksteal

test-fast: $(BIN)/.installed
	$(BIN)/python -m pytest -q -m "not slow"

lint: $(BIN)/.installed
	$(BIN)/ruff check src benchmarks tests
	$(BIN)/mypy src

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .ruff_cache .mypy_cache
