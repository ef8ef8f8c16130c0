#!/usr/bin/env bash
# The Mac's one command: join the desktop's cluster as the `mac` node and train on MPS.
#   RAY_AUTH_TOKEN=<the desktop's .env token> deploy/mac/worker.sh HEAD_HOST
# Creates (or reuses) ./.venv with the versions locked in deploy/constraints.txt (Python 3.11),
# refuses in one sentence if they differ from the head's, then runs a Ray node and a Dask worker
# labelled `mac` until Ctrl-C, which stops both. Works on Linux too (CI uses it as the "Mac", on CPU).
set -euo pipefail
if [ $# -lt 1 ] || [ "${1#-}" != "$1" ]; then
  echo "usage: RAY_AUTH_TOKEN=... $0 HEAD_HOST [hetbench worker options, e.g. --label mac]" >&2
  exit 2
fi
HEAD_HOST=$1; shift
cd "$(dirname "$0")/../.."
VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/hetbench" ]; then  # reused as it is otherwise: the version check below catches drift
  VENV="$VENV" bash deploy/install.sh
fi
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1  # Ray refuses multi-node clusters on macOS without it
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-token}
exec "$VENV/bin/hetbench" worker --head "$HEAD_HOST" "$@"
