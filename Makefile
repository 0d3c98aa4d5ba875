# Everyday targets. A fresh clone needs only python3 (>= 3.10) and make.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test lint typecheck check bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)  ## install, then merge the built-in sample family with RAM+
	$(BIN)/ramstream demo

test: $(STAMP)  ## install, then run the whole test suite
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check ramstream tests tools
	$(BIN)/ruff format --check ramstream tests tools

typecheck: $(STAMP)
	$(BIN)/mypy ramstream

check: lint typecheck test

bench: $(STAMP)  ## the spine benchmark on a 0.75B-parameter family (writes ~6 GB under bench-data/)
	$(BIN)/python tools/bench_spine.py --data bench-data

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
