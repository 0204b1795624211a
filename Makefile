# ortpack: every target installs what it needs into .venv first.
#   make run    the main job: package all-MiniLM-L6-v2 into dist/all-MiniLM-L6-v2
#   make test   lint, type-check and the whole test suite
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
EXTRAS := export,serve,kfp,dev

.PHONY: install run test unit lint typecheck format bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip>=24"
	$(PY) -m pip install --quiet -e ".[$(EXTRAS)]"
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/ortpack build --model all-MiniLM-L6-v2 --targets cpu --precisions fp32,int8 \
		--out dist/all-MiniLM-L6-v2 --force

test: lint typecheck
	$(PY) -m pytest

unit: $(STAMP)
	$(PY) -m pytest -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/hadolint Dockerfile.component

typecheck: $(STAMP)
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: $(STAMP)
	$(PY) bench/model_latency.py

clean:
	rm -rf dist build *.egg-info .mypy_cache .ruff_cache
