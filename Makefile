# ortpack: every target installs what it needs into .venv first.
#   make run    the main job: the packaging pipeline (kfp.local) on all-MiniLM-L6-v2 -> dist/
#   make test   lint, type-check and the whole test suite
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
EXTRAS := export,serve,kfp,dev

.PHONY: install run test unit lint typecheck format bench clean golden

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip>=24"
	$(PY) -m pip install --quiet -e ".[$(EXTRAS)]"
	touch $(STAMP)

install: $(STAMP)

# The package_model Kubeflow pipeline, run locally with kfp.local; replaces the previous bundle.
run: $(STAMP)
	$(BIN)/ortpack run --model all-MiniLM-L6-v2 --targets cpu --precisions fp32,int8 \
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

golden: $(STAMP)
	$(PY) -m pipelines.golden
