#!/usr/bin/env bash
# What a capture costs the link it taps, and what the taps cost when no capture runs.
#
# Each round measures exanet-perf rdma-bw (1 MiB writes, M1QAF2 -> M1QBF3, whose path
# crosses the torus link M1QAF1 -> M1QBF1) three ways, one after the other, so that a noisy
# machine affects all alike:
#   base: daemons built from BASELINE (a commit without capture taps, default 35c030e)
#   off:  this tree's daemons, no capture running
#   on:   this tree's daemons, `exactl capture --link M1QAF1 M1QBF1` writing a pcapng file
# and prints each round and the ratios off/base (the taps' idle cost) and on/off (the
# capture's cost), min/median/max.
#
# Needs release builds of this tree (cargo build --release -p exanetd -p exactl
# -p exanet-perf); the baseline is built in a git worktree under $TMPDIR on first use.
# Usage: [BASELINE=rev] [ITER=N] scripts/bench-capture.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
iter=${ITER:-300}
baseline=${BASELINE:-35c030e}
bin=$PWD/target/release
wt=${TMPDIR:-/tmp}/exanet-baseline
if [ ! -x "$wt/target/release/exanetd" ]; then
  git worktree add -f "$wt" "$baseline" >/dev/null
  (cd "$wt" && cargo build --release -q -p exanetd -p exactl -p exanet-perf)
fi
base=$wt/target/release
work=$(mktemp -d /tmp/exanet-bench-capture.XXXX)
servers=()
cleanup() {
  for p in "${servers[@]}"; do kill "$p" 2>/dev/null || true; done
  EXANET_DAEMON=$base/exanetd "$base/exactl" --rack "$work/base" rack down >/dev/null 2>&1 || true
  EXANET_DAEMON=$bin/exanetd "$bin/exactl" --rack "$work/cur" rack down >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

up() { # up BINDIR RACKDIR
  EXANET_DAEMON=$1/exanetd EXANET_RACK_IP=off "$1/exactl" --rack "$2" rack up --shape 2x1x1 >/dev/null
  "$1/exanet-perf" rdma-bw --rack "$2" --node M1QBF3 serve >/dev/null 2>&1 &
  servers+=($!)
}
bw() { # bw BINDIR RACKDIR -> Gb/s
  "$1/exanet-perf" rdma-bw --rack "$2" --node M1QAF2 run --peer M1QBF3 --sizes 1M \
    --iterations "$iter" --warmup 20 --json -q | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["gbps"])'
}
up "$base" "$work/base"
up "$bin" "$work/cur"
sleep 1
declare -a r_idle r_cap
for round in $(seq "$rounds"); do
  g_base=$(bw "$base" "$work/base")
  g_off=$(bw "$bin" "$work/cur")
  log=$work/cur/logs/M1QBF1.log
  started=$(grep -c "capture started" "$log" || true)
  "$bin/exactl" --rack "$work/cur" capture --link M1QAF1 M1QBF1 -w "$work/cap.pcapng" 2>"$work/cap.err" &
  cap=$!
  # Until the daemon has the tap.
  for _ in $(seq 100); do
    [ "$(grep -c "capture started" "$log" || true)" -gt "$started" ] && break
    sleep 0.05
  done
  g_on=$(bw "$bin" "$work/cur")
  kill -INT "$cap"; wait "$cap" || true
  summary=$(tail -1 "$work/cap.err")
  size=$(stat -c %s "$work/cap.pcapng")
  echo "round $round: base_gbps=$g_base off_gbps=$g_off on_gbps=$g_on capture_file_bytes=$size ($summary)"
  r_idle+=("$(python3 -c "print($g_off/$g_base)")")
  r_cap+=("$(python3 -c "print($g_on/$g_off)")")
done
python3 - "${r_idle[*]}" "${r_cap[*]}" <<'EOF'
import statistics, sys
for name, vals in (("off/base (taps idle)", sys.argv[1]), ("on/off (capture running)", sys.argv[2])):
    v = sorted(float(x) for x in vals.split())
    print(f"{name}: min {v[0]:.3f} median {statistics.median(v):.3f} max {v[-1]:.3f}")
EOF
