#!/usr/bin/env bash
# The Mac's one command: join the desktop's cluster as the `mac` node and train on MPS.
#   deploy/mac/worker.sh HEAD_HOST
# The Ray token is read from ~/.config/hetbench/ray-token (the desktop's .ray-token, copied), or
# the file RAY_AUTH_TOKEN_PATH names: never from the shell's history or the Dask worker's environment.
# Creates (or reuses) ./.venv with the versions locked in deploy/constraints.txt (Python 3.11),
# refuses in one sentence if they differ from the head's, then runs a Ray node and a Dask worker
# labelled `mac` until Ctrl-C, which stops both; the Mac does not sleep meanwhile (caffeinate).
# Before it joins, the model trains one forward and backward pass on MPS; MAC_DEVICE=cpu joins on
# the CPU instead (set it in the desktop's .env too). Works on Linux too (CI uses it as the "Mac",
# with MAC_DEVICE=cpu). Your own workload: in this checkout's workloads/, or `--workload-path DIR`
# for the folder it imports from (the same copy as the desktop's: the driver compares them).
set -euo pipefail
if [ $# -lt 1 ] || [ "${1#-}" != "$1" ]; then
  echo "usage: $0 HEAD_HOST [hetbench worker options, e.g. --label mac]" >&2
  exit 2
fi
HEAD_HOST=$1; shift
cd "$(dirname "$0")/../.."
if [ "$(uname -s)" = Darwin ]; then  # torch 2.13's only macOS wheel is for macOS 14+ on arm64: say so before installing
  MACOS=$(sw_vers -productVersion)
  if [ "${MACOS%%.*}" -lt 14 ]; then
    echo "worker.sh: torch 2.13 needs macOS 14 or newer and this Mac runs $MACOS: update macOS first" >&2
    exit 2
  fi
  PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}  # the one install.sh takes
  ARCH=$("$PYTHON" -c 'import platform; print(platform.machine())')
  if [ "$ARCH" != arm64 ]; then
    echo "worker.sh: $PYTHON is an $ARCH Python (Rosetta or an Intel Mac) and torch 2.13 for macOS is arm64 only: set PYTHON to an arm64 Python 3.11 (python.org's installer or Homebrew's /opt/homebrew)" >&2
    exit 2
  fi
  export PYTHON
fi
VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/hetbench" ]; then  # reused as it is otherwise: the version check below catches drift
  VENV="$VENV" bash deploy/install.sh
fi
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-token}
if [ -z "${RAY_AUTH_TOKEN:-}" ]; then
  export RAY_AUTH_TOKEN_PATH=${RAY_AUTH_TOKEN_PATH:-$HOME/.config/hetbench/ray-token}
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout: workloads/NAME.py as the desktop's containers see it
export PYTORCH_ENABLE_MPS_FALLBACK=0  # an op MPS lacks fails loudly, never runs on the CPU unseen
KEEP_AWAKE=()  # expanded below as macOS's bash 3.2 allows an empty array under `set -u`
if command -v caffeinate >/dev/null; then
  KEEP_AWAKE=(caffeinate -is)  # no idle or system sleep while the worker runs (on AC power for -s)
fi
exec ${KEEP_AWAKE[@]+"${KEEP_AWAKE[@]}"} "$VENV/bin/hetbench" worker --head "$HEAD_HOST" "$@"
