#!/usr/bin/env bash
# What modeled order costs against the host's order on one rack: the same 8 B pingpongs,
# Table 2's pairs (a) M1QAF1 -> M1QAF2 and (e) M1QAF2 -> M3QCF2, on a 4x4x2 rack (or
# SHAPE, with PAIRS), alternately with `[model] order = "host"` and `"modeled"` (the rack
# restarted in between), then the daemons' CPU while the rack idles in modeled order.
# Prints each run's wall-clock and modeled one-way p50, then per pair min/median/max of
# the modeled/host ratio of wall-clock p50s (alternated rounds), and the idle CPU.
# Needs release builds: cargo build --release -p exanetd -p exactl -p exanet-perf
# Usage: scripts/bench-order.sh [ROUNDS]   (IP=on to run the rack with IP; default off)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
shape=${SHAPE:-4x4x2}
pairs=${PAIRS:-"M1QAF1:M1QAF2 M1QAF2:M3QCF2"}
iters=${ITER:-100}
bin=$PWD/target/release
rack=$(mktemp -d /tmp/exanet-bench-order.XXXX)
out=$(mktemp /tmp/exanet-bench-order-out.XXXX)
export EXANET_RACK=$rack EXANET_DAEMON=$bin/exanetd
servers=()
stop_servers() {
  for s in "${servers[@]}"; do kill "$s" 2>/dev/null || true; done
  for s in "${servers[@]}"; do wait "$s" 2>/dev/null || true; done
  servers=()
}
cleanup() {
  stop_servers
  "$bin/exactl" rack down >/dev/null 2>&1 || true
  rm -rf "$rack" "$out" "$out.err"
}
trap cleanup EXIT
# exactl's progress goes to stderr: shown only when it fails.
exactl() { "$bin/exactl" "$@" >/dev/null 2>"$out.err" || { cat "$out.err" >&2; exit 1; }; }
exactl rack up --shape "$shape" --ip off
exactl rack down
base=$(cat "$rack/rack.toml")
up() { # ORDER
  printf '%s\n\n[model]\norder = "%s"\n' "$base" "$1" >"$rack/rack.toml"
  exactl rack up --ip "${IP:-off}"
  for p in $pairs; do
    EXANET_NODE=${p#*:} "$bin/exanet-perf" pingpong serve >/dev/null 2>&1 &
    servers+=($!)
  done
  sleep 0.5
}
down() {
  stop_servers
  exactl rack down
}
json() { python3 -c "import json,sys; d=json.loads(sys.stdin.readline()); print(' '.join(str(d[k]) for k in sys.argv[1:]))" "$@"; }
for round in $(seq "$rounds"); do
  for order in host modeled; do
    up "$order"
    for p in $pairs; do
      start=$(date +%s.%N)
      r=$(EXANET_NODE=${p%%:*} "$bin/exanet-perf" pingpong run --peer "${p#*:}" --sizes 8 \
        --iterations "$iters" --warmup 5 --json --quiet | json p50_us modeled_p50_us)
      took=$(echo "$(date +%s.%N) - $start" | bc)
      echo "round $round $order $p: wall p50 ${r% *} us, modeled p50 ${r#* } us, run ${took} s"
      echo "$round $p $order ${r% *}" >>"$out"
    done
    down
  done
done
echo "modeled/host, wall-clock one-way p50 (min / median / max over $rounds rounds):"
for p in $pairs; do
  python3 - "$out" "$p" <<'EOF'
import sys, statistics
rows = [l.split() for l in open(sys.argv[1])]
p = sys.argv[2]
by = {}
for r, pair, order, v in rows:
    if pair == p:
        by.setdefault(r, {})[order] = float(v)
ratios = sorted(d["modeled"] / d["host"] for d in by.values() if len(d) == 2)
print(f"  {p}: {ratios[0]:.2f} / {statistics.median(ratios):.2f} / {ratios[-1]:.2f}")
EOF
done
# The rack idle in modeled order: its daemons' CPU over 10 s, from /proc/PID/stat.
up modeled
stop_servers
pids=$(pgrep -f "exanetd --rack $rack" || true)
ticks() { for p in $pids; do awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null; done | paste -sd+ | bc; }
t0=$(ticks)
sleep 10
t1=$(ticks)
hz=$(getconf CLK_TCK)
echo "idle $shape rack in modeled order: $(echo "scale=2; ($t1 - $t0) * 100 / $hz / 10" | bc)% of a core"
