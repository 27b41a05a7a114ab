#!/usr/bin/env bash
# The project against the floor it rides on, alternated per round so that a noisy machine
# affects both alike. Each round runs
#   floor:   exanet-perf floor (QUIC alone, two endpoints set up as exanetd's links, in one
#            process on loopback): 8 B ping-pong one-way p50, 256 B frame stream Gb/s;
#   project: on a 1x1x1 rack (--ip off), M1QAF1 -> M1QAF2 (one link, no torus hop):
#            exanet-perf pingpong 8 B one-way p50 (and the QUIC packets it took per cell,
#            from exactl status) and rdma-bw 4 MiB writes (window 8) Gb/s.
# Then prints each figure's min/median/max over the rounds, and the per-round ratios
# project/floor (latency: how many times the floor's; bandwidth: which fraction of it).
# Needs release builds:
#   cargo build --release -p exanetd -p exactl -p exanet-perf
# Usage: scripts/bench-floor.sh [ROUNDS]   (default 3)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
case $rounds in '' | *[!0-9]* | 0) echo "bench-floor: ROUNDS must be a positive number" >&2; exit 2 ;; esac
bin=$PWD/target/release
for b in exanetd exactl exanet-perf; do
  [ -x "$bin/$b" ] || { echo "bench-floor: $bin/$b is not built (cargo build --release -p $b)" >&2; exit 2; }
done
rack=$(mktemp -d /tmp/exanet-bench-floor.XXXXXX)
results=$(mktemp /tmp/exanet-bench-floor-results.XXXXXX)
out=$(mktemp /tmp/exanet-bench-floor-out.XXXXXX)
export EXANET_RACK=$rack EXANET_DAEMON=$bin/exanetd
server=
cleanup() {
  if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
  "$bin/exactl" --rack "$rack" rack down >/dev/null 2>&1 || true
  rm -rf "$rack" "$results" "$out"
}
trap cleanup EXIT

if ! up=$(RUST_LOG=warn "$bin/exactl" --rack "$rack" rack up --shape 1x1x1 --ip off 2>&1); then
  printf '%s\n' "$up" >&2
  exit 1
fi

# A field of the one-line JSON object on stdin whose "bench" is $1.
field() {
  { grep "\"bench\":\"$1\"" || true; } | sed -n "s/.*\"$2\":\([0-9.e+-]*\).*/\1/p" | head -1
}

# Cells and QUIC packets sent so far on M1QAF1's link to M1QAF2: "CELLS PACKETS".
link_counts() {
  "$bin/exactl" --rack "$rack" status --json | python3 -c '
import json, sys
d = json.load(sys.stdin)
l = next(l for n in d["nodes"] if n["node"] == "M1QAF1" for l in n["links"] if l["peer"] == "M1QAF2")
print(l["tx_cells"], l["quic"]["sent_packets"])'
}

# Starts a server on M1QAF2 and waits for its ready line.
serve() {
  EXANET_NODE=M1QAF2 "$bin/exanet-perf" pingpong serve >"$out" 2>&1 &
  server=$!
  for _ in $(seq 200); do
    grep -q '^ready ' "$out" && return 0
    kill -0 "$server" 2>/dev/null || break
    sleep 0.05
  done
  echo "bench-floor: the server on M1QAF2 did not start:" >&2
  cat "$out" >&2
  exit 1
}

for round in $(seq "$rounds"); do
  f=$("$bin/exanet-perf" floor --quiet --json)
  f_lat=$(printf '%s\n' "$f" | field floor-pingpong p50_us)
  f_bw=$(printf '%s\n' "$f" | field floor-stream gbps)

  serve
  before=$(link_counts)
  p_lat=$(EXANET_NODE=M1QAF1 "$bin/exanet-perf" pingpong run --peer M1QAF2 --quiet \
    --sizes 8 --iterations 5000 --json | field pingpong p50_us)
  after=$(link_counts)
  # QUIC packets per cell the ping-pong sent on M1QAF1 -> M1QAF2 (its messages and the
  # NI's acknowledgements): 1 when nothing else needs a packet of its own.
  p_ppc=$(awk -v b="$before" -v a="$after" 'BEGIN { split(b, x); split(a, y); printf "%.2f", (y[2] - x[2]) / (y[1] - x[1]) }')
  p_bw=$(EXANET_NODE=M1QAF1 "$bin/exanet-perf" rdma-bw run --peer M1QAF2 --quiet \
    --sizes 4M --iterations 32 --json | field rdma-bw gbps)
  kill "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
  server=

  for v in "$f_lat" "$f_bw" "$p_lat" "$p_bw" "$p_ppc"; do
    [ -n "$v" ] || { echo "bench-floor: round $round gave no figure (floor: $f)" >&2; exit 1; }
  done
  lat_ratio=$(awk -v p="$p_lat" -v f="$f_lat" 'BEGIN { printf "%.2f", p / f }')
  bw_ratio=$(awk -v p="$p_bw" -v f="$f_bw" 'BEGIN { printf "%.2f", p / f }')
  printf 'round %s: floor one-way p50 %s us, 256 B frames %s Gb/s | project pingpong 8 B one-way p50 %s us (%s packets per cell), rdma-bw 4 MiB %s Gb/s | latency x%s, bandwidth x%s\n' \
    "$round" "$f_lat" "$f_bw" "$p_lat" "$p_ppc" "$p_bw" "$lat_ratio" "$bw_ratio"
  printf 'floor_one_way_p50_us %s\nfloor_frames_gbps %s\nproject_pingpong_p50_us %s\npingpong_packets_per_cell %s\nproject_rdma_bw_gbps %s\nlatency_project/floor %s\nbandwidth_project/floor %s\n' \
    "$f_lat" "$f_bw" "$p_lat" "$p_ppc" "$p_bw" "$lat_ratio" "$bw_ratio" >>"$results"
done

echo
printf '%-26s %10s %10s %10s\n' "over $rounds rounds" min median max
for fig in floor_one_way_p50_us project_pingpong_p50_us pingpong_packets_per_cell latency_project/floor \
  floor_frames_gbps project_rdma_bw_gbps bandwidth_project/floor; do
  awk -v f="$fig" '$1 == f { print $2 }' "$results" | sort -g |
    awk -v f="$fig" '{ v[NR] = $1 } END { printf "%-26s %10s %10s %10s\n", f, v[1], v[int((NR + 1) / 2)], v[NR] }'
done
