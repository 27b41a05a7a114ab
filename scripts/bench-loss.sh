#!/usr/bin/env bash
# Goodput of verified RDMA writes across a lossy link, on a 2x1x1 local rack: M1QAF2
# writes into M1QBF3 (three hops; the middle one is the torus link M1QAF1 <-> M1QBF1,
# which gets the loss in both directions). Each rate moves 64 MiB as 4 MiB transfers,
# every byte checked; the rates are run in turn, ROUNDS times, so that the lossless
# baseline and the lossy runs share the machine's noise.
#
#   scripts/bench-loss.sh [ROUNDS] [RATES...]     (defaults: 3 rounds; 0% 1% 10% 30%)
#
# Builds release binaries first (PROFILE=debug for a debug build). Prints one line per
# run (Gb/s of the measured transfers, runs that failed, and the NI's timeouts and
# retransmissions at both ends during the run: at 0% every one is spurious) and then
# min/median/max per rate, and each rate's median as a ratio of the lossless one.
set -euo pipefail
rounds=${1:-3}
shift || true
rates=("$@")
[ ${#rates[@]} -gt 0 ] || rates=(0% 1% 10% 30%)
cd "$(dirname "$0")/.."
profile=${PROFILE:-release}
if [ "$profile" = release ]; then
  cargo build --release -q -p exanetd -p exactl -p exanet-perf
else
  cargo build -q -p exanetd -p exactl -p exanet-perf
fi
bin=${CARGO_TARGET_DIR:-target}/$profile
dir=$(mktemp -d /tmp/exanet-bench-loss.XXXXXX)
x() { "$bin/exactl" --rack "$dir" "$@"; }
server=
cleanup() {
  [ -n "$server" ] && kill "$server" 2>/dev/null
  x rack down >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT
RUST_LOG=warn x rack up --shape 2x1x1 --timeout 60 >/dev/null
"$bin/exanet-perf" --rack "$dir" --node M1QBF3 rdma-bw serve >"$dir/serve.log" 2>&1 &
server=$!

# Timeouts and retransmissions of the NIs at both ends, summed.
ni_counts() {
  x status --json | python3 -c '
import json, sys
nodes = {n["node"]: n.get("ni") or {} for n in json.load(sys.stdin)["nodes"]}
ni = [nodes[n] for n in ("M1QAF2", "M1QBF3")]
print(sum(n.get("timeouts", 0) for n in ni), sum(n.get("retransmissions", 0) for n in ni))'
}

results=$(mktemp)
for round in $(seq "$rounds"); do
  for rate in "${rates[@]}"; do
    if [ "$rate" = 0% ]; then
      x link clear M1QAF1 M1QBF1 >/dev/null
    else
      x link set M1QAF1 M1QBF1 --loss "$rate" >/dev/null
    fi
    read -r to0 re0 < <(ni_counts)
    # 16 x 4 MiB = 64 MiB measured, after one unmeasured transfer.
    out=$("$bin/exanet-perf" --rack "$dir" --node M1QAF2 rdma-bw run --peer M1QBF3 \
      --sizes 4M --iterations 16 --warmup 1 --verify --json --timeout-ms 60000 2>&1) || true
    gbps=$(printf '%s\n' "$out" | sed -n 's/.*"gbps": *\([0-9.e+-]*\).*/\1/p' | head -1)
    failed=$(printf '%s\n' "$out" | grep -c -i -E 'error|failed|timed out' || true)
    [ -n "$gbps" ] || gbps=0
    read -r to1 re1 < <(ni_counts)
    printf 'round %s loss %-4s %8.3f Gb/s  failed runs: %s  NI timeouts %s, retransmissions %s\n' \
      "$round" "$rate" "$gbps" "$failed" "$((to1 - to0))" "$((re1 - re0))"
    [ "$failed" = 0 ] || printf '%s\n' "$out" | tail -2 | sed 's/^/    /'
    printf '%s %s\n' "$rate" "$gbps" >>"$results"
  done
done
x link clear M1QAF1 M1QBF1 >/dev/null

base=$(awk '$1 == "0%" { print $2 }' "$results" | sort -g | awk '{ v[NR] = $1 } END { print (NR ? v[int((NR + 1) / 2)] : 0) }')
for rate in "${rates[@]}"; do
  awk -v r="$rate" '$1 == r { print $2 }' "$results" | sort -g | awk -v r="$rate" -v b="$base" '
    { v[NR] = $1 }
    END {
      med = v[int((NR + 1) / 2)]
      printf "loss %-4s goodput min %.3f / median %.3f / max %.3f Gb/s", r, v[1], med, v[NR]
      if (b > 0) printf "  (median %.0f%% of lossless)", 100 * med / b
      printf "\n"
    }'
done
rm -f "$results"
