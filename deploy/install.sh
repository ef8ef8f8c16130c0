#!/usr/bin/env bash
# Creates ./.venv with hetbench and its test tools, at the versions locked in deploy/constraints.txt
# (the same ones the Docker image and the Mac install: nodes must match). On a machine without an
# NVIDIA GPU it installs torch's CPU build first, so nothing pulls the multi-GB CUDA build (on Linux;
# a Mac gets the normal one).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
# Python's minor version must equal the head's (the image's): 3.11
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
"$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || {
  echo "install.sh: hetbench nodes run Python 3.11 (found $("$PYTHON" --version 2>&1)); set PYTHON=/path/to/python3.11" >&2
  exit 2
}
CONSTRAINTS=deploy/constraints.txt
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
if [ "$(uname -s)" = Linux ] && ! command -v nvidia-smi >/dev/null 2>&1; then
  # On the project's machines this version lies on disk as a CPU build. Elsewhere add
  # PIP_INDEX_URL pointing at PyTorch's CPU wheel index to get the CPU build.
  "$VENV/bin/python" -m pip install -q -c "$CONSTRAINTS" "torch==$TORCH_VERSION"
fi
"$VENV/bin/python" -m pip install -q -c "$CONSTRAINTS" -e ".[test]"
echo "installed: $("$VENV/bin/python" -c 'import torch, ray; print("torch", torch.__version__, "ray", ray.__version__)')"
