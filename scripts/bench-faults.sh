#!/usr/bin/env bash
# Fault commands as an operator sees them, on a 2x2x1 local rack: wall time of
# `exactl link set` / `link clear` (process start to exit: read the current faults, set
# both ends), and what a delay does to the round trip across a torus link.
#
#   scripts/bench-faults.sh [TRIALS]      (default 30)
#
# Builds release binaries first. Prints one line per figure. The time from a daemon
# taking the request to the first dropped cell is `cargo bench -p exanetd --bench faults`.
set -euo pipefail
trials=${1:-30}
cd "$(dirname "$0")/.."
cargo build --release -q -p exanetd -p exactl
bin=${CARGO_TARGET_DIR:-target}/release
dir=$(mktemp -d /tmp/exanet-bench-faults.XXXXXX)
x() { "$bin/exactl" --rack "$dir" "$@"; }
trap 'x rack down >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
RUST_LOG=warn x rack up --shape 2x2x1 --timeout 60 >/dev/null

ms=()
for _ in $(seq "$trials"); do
  for cmd in "link set M1QAF1 M1QBF1 --loss 1%" "link clear M1QAF1 M1QBF1"; do
    t0=$(date +%s%N); x $cmd; t1=$(date +%s%N)
    ms+=("$(( (t1 - t0) / 1000 ))")
  done
done
printf '%s\n' "${ms[@]}" | sort -n | awk '{ v[NR] = $1 } END {
  printf "exactl link set/clear wall time: p50 %.1f ms, p90 %.1f ms, max %.1f ms (%d commands)\n",
    v[int(NR / 2)] / 1000, v[int(NR * 0.9)] / 1000, v[NR] / 1000, NR }'

rtt() { x ping M1QAF1 M1QBF1 --count 200 --json | sed -n 's/.*"rtt_us": *\([0-9.]*\).*/\1/p' | head -1; }
base=$(rtt)
for d in 200us 1ms 5ms; do
  x link set M1QAF1 M1QBF1 --delay "$d"
  r=$(rtt)
  x link clear M1QAF1 M1QBF1
  awk -v b="$base" -v r="$r" -v d="$d" 'BEGIN {
    printf "probe rtt M1QAF1<->M1QBF1 with --delay %s both ways: p50 %.0f us (no fault: %.0f us; added %.0f us)\n", d, r, b, r - b }'
done
