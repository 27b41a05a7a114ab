#!/usr/bin/env bash
# Repeatability of the contention benchmarks in modeled order ([model] order = "modeled",
# docs/modeled-time.md): each pattern of `exanet-perf contend` runs ROUNDS times back to
# back on one rack per shape (the first run is a fresh rack's), optionally with a busy loop
# on every core. Prints each run's modeled rate per flow (Gb/s of payload) and, per flow,
# the spread over the runs; a figure that repeats has spread 0.
# Needs: cargo build --release -p exanetd -p exactl -p exanet-perf
# Usage: [HOG=1] [SIZE=256K] [ITER=4] [WINDOW=2] scripts/bench-contend.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2}
bin=$PWD/target/release
size=${SIZE:-256K}
iter=${ITER:-4}
window=${WINDOW:-2}
export EXANET_DAEMON=$bin/exanetd
racks=()
hogs=()
cleanup() {
  for h in "${hogs[@]}"; do kill "$h" 2>/dev/null || true; done
  for r in "${racks[@]}"; do
    EXANET_RACK=$r "$bin/exactl" rack down >/dev/null 2>&1 || true
    rm -rf "$r"
  done
}
trap cleanup EXIT
if [ "${HOG:-0}" = 1 ]; then
  for _ in $(seq "$(nproc)"); do
    (while :; do :; done) &
    hogs+=($!)
  done
fi
out=$(mktemp /tmp/exanet-bench-contend.XXXX)
racks+=("$out")
for shape in 2x1x1 3x1x1; do
  r=$(mktemp -d /tmp/exanet-bench-contend.XXXX)
  racks+=("$r")
  EXANET_RACK=$r "$bin/exactl" rack up --shape "$shape" --ip off >/dev/null 2>&1
  EXANET_RACK=$r "$bin/exactl" rack down >/dev/null 2>&1
  printf '\n[model]\norder = "modeled"\n' >>"$r/rack.toml"
  EXANET_RACK=$r "$bin/exactl" rack up --ip off >/dev/null 2>&1
  if [ "$shape" = 2x1x1 ]; then patterns="shared-link bidir qfdb-all-to-all"; else patterns=incast; fi
  for p in $patterns; do
    extra=()
    [ "$p" = incast ] && extra=(--senders 7)
    for run in $(seq "$rounds"); do
      EXANET_RACK=$r "$bin/exanet-perf" contend --pattern "$p" "${extra[@]}" --size "$size" \
        --iterations "$iter" --window "$window" --json 2>/dev/null |
        python3 -c '
import json, sys
pattern, run = sys.argv[1], sys.argv[2]
rates = []
for d in map(json.loads, sys.stdin):
    if "from" not in d:
        continue
    flow, gbps = d["from"] + ">" + d["to"], d["modeled_gbps"]
    rates.append(f"{flow} {gbps}")
    print(f"RATE {pattern} {flow} {gbps}", file=sys.stderr)
print(f"{pattern} run {run}: " + ", ".join(rates))
' "$p" "$run" 2>>"$out"
    done
  done
  EXANET_RACK=$r "$bin/exactl" rack down >/dev/null 2>&1
done
echo "spread per flow over $rounds runs ((max - min) / median):"
python3 -c '
import collections, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    _, pattern, flow, rate = line.split()
    runs[(pattern, flow)].append(float(rate))
worst = collections.defaultdict(float)
for (pattern, flow), r in runs.items():
    worst[pattern] = max(worst[pattern], (max(r) - min(r)) / statistics.median(r))
for pattern, w in worst.items():
    print(f"  {pattern}: worst flow {100 * w:.2f}%")
' "$out"
