# The two commands of the quickstart: `make reproduce` and `make test`.
# Each bootstraps .venv from this repository's own files when it is missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: reproduce test test-all train-zoo benchmark clean-venv

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

reproduce: $(STAMP)
	$(PY) -m specjax.main --config=configs/seed_reproduction.py:runlocal --workdir=runs/seed_reproduction

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile

test-all: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile -m ''

train-zoo: $(STAMP)
	$(PY) experiments/train_zoo.py

benchmark: $(STAMP)
	$(PY) experiments/benchmark.py

clean-venv:
	rm -rf $(VENV)
