#!/usr/bin/env bash
# Creates ./.venv with hetbench and its test tools. On a machine without an NVIDIA GPU it installs
# torch's CPU build first, so nothing pulls the multi-GB CUDA build (on Linux; a Mac gets the normal one).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
if [ "$(uname -s)" = Linux ] && ! command -v nvidia-smi >/dev/null 2>&1; then
  # On the project's machines this version lies on disk as a CPU build. Elsewhere add
  # PIP_INDEX_URL pointing at PyTorch's CPU wheel index to get the CPU build.
  "$VENV/bin/python" -m pip install -q "torch==$TORCH_VERSION"
fi
"$VENV/bin/python" -m pip install -q -e ".[test]"
echo "installed: $("$VENV/bin/python" -c 'import torch, ray; print("torch", torch.__version__, "ray", ray.__version__)')"
