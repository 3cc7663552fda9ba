# Two entry points for a fresh machine with only Python: `make demo` and `make test`.
# CI (.ci/run) also runs `make lint`, `make docs` and `make test-slow`.
PYTHON ?= python3
VENV ?= .venv
# The CPU build; on these machines it is served from a local folder. Override on other hosts.
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin

# torchvision and timm import only beside the torch they were built for: their models' tests run in an environment
# of their own (`make test-models`), which CI builds too.
MODELS_VENV ?= .venv-models
MODELS_TORCH ?= torch==2.14.1
MODELS_BIN := $(MODELS_VENV)/bin

.PHONY: demo test test-slow test-models lint docs clean

$(BIN)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e '.[all,test,lint,docs]'
	touch $@

demo: $(BIN)/.installed
	$(BIN)/edgetrain demo

# The default suite covers every module; the long integration tests are marked `slow` and run apart.
test: $(BIN)/.installed
	$(BIN)/python -m pytest -q -n 2 --dist worksteal -m "not slow"

test-slow: $(BIN)/.installed
	$(BIN)/python -m pytest -q -n 2 --dist worksteal -m slow

$(MODELS_BIN)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(MODELS_VENV)
	$(MODELS_BIN)/python -m pip install --quiet --upgrade pip
	$(MODELS_BIN)/python -m pip install --quiet "$(MODELS_TORCH)"
	$(MODELS_BIN)/python -m pip install --quiet -e '.[zoo,models,test]'
	touch $@

# Published models of torchvision, timm and transformers, as their libraries build them.
test-models: $(MODELS_BIN)/.installed
	$(MODELS_BIN)/python -m pytest -q -n 2 --dist worksteal tests/test_published_models.py tests/test_library_models.py

docs: $(BIN)/.installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir build/site

lint: $(BIN)/.installed
	$(BIN)/ruff check src benchmarks tests
	$(BIN)/mypy src

clean:
	rm -rf $(VENV) $(MODELS_VENV) build src/*.egg-info .pytest_cache .ruff_cache .mypy_cache
