#!/usr/bin/env bash
# What CUDA (or MPS) changes, checked on a real GPU in one command, within about 8 minutes:
#   deploy/ci/gpu-check.sh [cuda|mps|cpu]     (default cuda; CI runs it as `cpu` so it cannot rot)
# Every step has its own timeout, a failed step does not stop the ones after it, and the end is a
# summary. It writes $RESULTS_DIR/gpu-<device name>.md (RESULTS_DIR: results) and exits 1 if any
# step failed. On a GPU machine with PyPI reachable it installs ./.venv first (deploy/install.sh).
set -uo pipefail
cd "$(dirname "$0")/../.."
DEV=${1:-cuda}
case "$DEV" in cuda|cuda:*|mps|cpu) ;; *) echo "usage: $0 [cuda|cuda:N|mps|cpu]" >&2; exit 2 ;; esac
[ "$DEV" = cpu ] && QUICK=1 || QUICK=${QUICK:-0}  # CPU mode: every step, on fewer steps
RESULTS_DIR=${RESULTS_DIR:-results}
PY=.venv/bin/python
HB=.venv/bin/hetbench
LOG=$(mktemp -d)
trap 'rm -rf "$LOG"' EXIT
export PYTORCH_ENABLE_MPS_FALLBACK=0
STEPS=() RESULTS=() SECONDS_TAKEN=()

# Only what a stock Mac ships: macOS has neither GNU `timeout` nor `nproc` (CI runs this without them)
set -m  # each background job its own process group: a step is stopped with everything it started
limited() {  # limited LIMIT_S COMMAND...: the command, stopped after LIMIT_S (TERM, then KILL 10 s on); 124 then
  local limit=$1 pid watchdog rc
  shift
  rm -f "$LOG/timed-out"
  "$@" &
  pid=$!
  (
    sleep "$limit"
    touch "$LOG/timed-out"
    kill -TERM -- "-$pid" 2>/dev/null
    sleep 10
    kill -KILL -- "-$pid" 2>/dev/null
  ) >/dev/null 2>&1 &
  watchdog=$!
  wait "$pid"
  rc=$?
  kill -- "-$watchdog" 2>/dev/null
  wait "$watchdog" 2>/dev/null
  [ -e "$LOG/timed-out" ] && rc=124
  return $rc
}

step() {  # step NAME TIMEOUT_S COMMAND...: run, keep its output, never stop the script
  local name=$1 limit=$2 started=$SECONDS rc
  shift 2
  echo "== $name"
  limited "$limit" "$@" </dev/null >"$LOG/${#STEPS[@]}.out" 2>&1
  rc=$?
  tail -n 15 "$LOG/${#STEPS[@]}.out"
  case $rc in 0) result=ok ;; 124|137) result="timed out after ${limit} s" ;; *) result="failed ($rc)" ;; esac
  STEPS+=("$name") RESULTS+=("$result") SECONDS_TAKEN+=($((SECONDS - started)))
  echo "-- $name: $result"
}

MACHINE='uname -srm; echo "CPUs: $(getconf _NPROCESSORS_ONLN)"; if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv; fi'

if [ "$QUICK" = 1 ]; then  # the overhead check reports only: a shared CPU runner's noise is no GPU's overhead
  BASE=(--steps 12 --rounds 2 --report-only) RUN=(--set steps=3 --set warmup_steps=1 --set standalone_steps=2)
else  # a 2 ms step: 200 of them a round for a CV under 5%; above the target the step fails
  BASE=(--steps 200 --rounds 7) RUN=(--set steps=20 --set warmup_steps=3 --set standalone_steps=10)
fi
RUN+=(--set repeats=1 --set eval_every=10 --set eval_samples=500 --set test_samples=500 --set floor.iterations=5)

step "the machine and its driver" 30 bash -c "$MACHINE"
if [ ! -x "$HB" ]; then
  step "install (deploy/install.sh)" 300 bash deploy/install.sh
fi
step "the gate: hetbench devices --require $DEV" 120 "$HB" devices --require "$DEV"
for batch in 128 256; do
  step "single against pytorch/examples' loop, batch $batch (target 1.03)" 150 \
    "$PY" benchmarks/baseline_overhead.py --device "$DEV" --batch "$batch" "${BASE[@]}"
done
step "the wire round trip of a $DEV buffer, every wire_dtype" 60 "$PY" deploy/ci/device_checks.py wire "$DEV"
step "gloo's weighted all-reduce of $DEV tensors" 90 "$PY" deploy/ci/device_checks.py allreduce "$DEV"
step "torch-ddp on two $DEV workers = single, after 5 steps" 150 "$PY" deploy/ci/device_checks.py ddp "$DEV"
step "every strategy, two $DEV workers on two local-multinode nodes" 330 \
  "$HB" run -c benchmarks/configs/quick.yaml "${RUN[@]}" --set balance=[equal] --set floor.enabled=false \
  --set "workers=[{name: a, node: a, device: '$DEV'}, {name: b, node: b, device: '$DEV'}]" \
  --set cluster.mode=local-multinode --results-dir "$LOG/runs"
step "a $DEV + cpu pair, balance auto" 240 \
  "$HB" run -c benchmarks/configs/quick.yaml "${RUN[@]}" --set balance=[auto] \
  --set "strategies=[single, ray-ps, torch-ddp]" \
  --set "workers=[{name: fast, device: '$DEV'}, {name: cpu, device: cpu}]" --results-dir "$LOG/runs"

NAME=$("$PY" -c "import sys, torch; sys.path.insert(0, '.'); from hetbench.devices import describe, resolve_device; print(describe(resolve_device('$DEV')))" 2>/dev/null || echo "$DEV")
SLUG=$(echo "$NAME" | tr 'A-Z' 'a-z' | sed -e 's/[^a-z0-9]\{1,\}/-/g' -e 's/^-//' -e 's/-$//')
mkdir -p "$RESULTS_DIR"
REPORT="$RESULTS_DIR/gpu-$SLUG.md"
FAILED=0
{
  echo "# gpu-check on $NAME"
  echo
  echo "\`deploy/ci/gpu-check.sh $DEV\`, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo
  echo "| step | result | seconds |"
  echo "| --- | --- | --- |"
  for i in "${!STEPS[@]}"; do
    echo "| ${STEPS[$i]} | ${RESULTS[$i]} | ${SECONDS_TAKEN[$i]} |"
    [ "${RESULTS[$i]}" = ok ] || FAILED=1
  done
  for i in "${!STEPS[@]}"; do
    echo
    echo "## ${STEPS[$i]}: ${RESULTS[$i]}"
    echo
    echo '```'
    tail -n 25 "$LOG/$i.out"
    echo '```'
  done
} >"$REPORT"
echo
sed -n '/^| step/,/^$/p' "$REPORT"
echo "written: $REPORT"
exit $FAILED
