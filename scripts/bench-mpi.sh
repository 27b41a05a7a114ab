#!/usr/bin/env bash
# MPI over the NI (the libfabric provider) against MPI over IP over ExaNet and against the
# NI's own floor, on the same pair of nodes (M1QAF1, M1QBF1: one torus hop), alternated per
# round so that a noisy machine affects all alike:
#   NetPIPE (NPopenmpi) through `exactl mpirun --fabric ni` and `--fabric ip`: 8 B one-way
#     latency and 4 MiB throughput;
#   exanet-perf pingpong, 8 B one-way p50, and rdma-bw, 4 MiB writes with one and with eight
#     in flight: what the NI itself does.
# Prints a line per round, each figure's min/median/max, and the medians of the per-round
# ratios the issue's targets are about (NetPIPE ni 8 B / pingpong 8 B <= 1.3; NetPIPE ni
# 4 MiB / rdma-bw 4 MiB >= 0.8).
# Needs root, /dev/net/tun, Debian's openmpi-bin netpipe-openmpi, and release builds (built
# here if missing).
# Usage: scripts/bench-mpi.sh [ROUNDS]   (default 3)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
case $rounds in '' | *[!0-9]* | 0) echo "bench-mpi: ROUNDS must be a positive number" >&2; exit 2 ;; esac
[ "$(id -u)" = 0 ] || { echo "bench-mpi: needs root (network namespaces)" >&2; exit 2; }
bin=$PWD/target/release
for b in exanetd exactl exanet-ip exanet-perf libexanet_fi.so; do
  [ -e "$bin/$b" ] || cargo build --release -q -p exanetd -p exactl -p exanet-ip -p exanet-perf -p exanet-fi
done
for t in mpirun.openmpi NPopenmpi; do
  command -v "$t" >/dev/null || { echo "bench-mpi: $t is missing (apt-get install openmpi-bin netpipe-openmpi)" >&2; exit 2; }
done

rack=$(mktemp -d /tmp/exanet-bench-mpi.XXXXXX)
work=$(mktemp -d /tmp/exanet-bench-mpi-work.XXXXXX)
results=$work/results
export EXANET_RACK=$rack EXANET_DAEMON=$bin/exanetd EXANET_IP=$bin/exanet-ip
server=
cleanup() {
  [ -n "$server" ] && kill "$server" 2>/dev/null
  "$bin/exactl" --rack "$rack" rack down >/dev/null 2>&1 || true
  rm -rf "$rack" "$work"
}
trap cleanup EXIT

if ! up=$(RUST_LOG=warn "$bin/exactl" --rack "$rack" rack up --shape 2x1x1 --ip on 2>&1); then
  printf '%s\n' "$up" >&2
  exit 1
fi
cd "$work"
a=M1QAF1 b=M1QBF1

# netpipe FABRIC LOWER UPPER: NetPIPE between a and b over FABRIC; prints "size us Mbps" per
# size it measured.
netpipe() {
  local out=$work/np.$1.$2
  rm -f "$out"
  timeout -k 10 300 "$bin/exactl" --rack "$rack" mpirun --fabric "$1" --nodes "$a,$b" -- \
    NPopenmpi -l "$2" -u "$3" -o "$out" >"$work/np.log" 2>&1 || {
    echo "bench-mpi: NetPIPE over $1 failed:" >&2
    tail -5 "$work/np.log" >&2
    exit 1
  }
  # NetPIPE's file: size, Mbps, seconds per one-way transfer.
  awk '{ printf "%d %.3f %.3f\n", $1, $3 * 1e6, $2 }' "$out"
}

perf() {
  EXANET_NODE=$a timeout 120 "$bin/exanet-perf" "$@" --json 2>/dev/null | tail -1
}

for r in $(seq 1 "$rounds"); do
  ni8=$(netpipe ni 8 8 | awk '$1 == 8 { print $2 }')
  ni4=$(netpipe ni 4194304 4194304 | awk '$1 == 4194304 { print $3 }')
  ip8=$(netpipe ip 8 8 | awk '$1 == 8 { print $2 }')
  ip4=$(netpipe ip 4194304 4194304 | awk '$1 == 4194304 { print $3 }')
  EXANET_NODE=$b "$bin/exanet-perf" pingpong serve >/dev/null 2>&1 &
  server=$!
  sleep 0.5
  pp=$(perf pingpong run --peer "$b" --sizes 8 --iterations 2000 | python3 -c 'import json,sys; print(json.load(sys.stdin)["p50_us"])')
  kill "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
  EXANET_NODE=$b "$bin/exanet-perf" rdma-bw serve >/dev/null 2>&1 &
  server=$!
  sleep 0.5
  bw1=$(perf rdma-bw run --peer "$b" --sizes 4M --iterations 8 --window 1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["gbps"] * 1000)')
  bw8=$(perf rdma-bw run --peer "$b" --sizes 4M --iterations 8 --window 8 | python3 -c 'import json,sys; print(json.load(sys.stdin)["gbps"] * 1000)')
  kill "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
  server=
  printf 'round %s: NetPIPE 8 B one-way ni %s us, ip %s us; 4 MiB ni %s Mb/s, ip %s Mb/s; pingpong 8 B %s us; rdma-bw 4 MiB window 1 %s Mb/s, window 8 %s Mb/s\n' \
    "$r" "$ni8" "$ip8" "$ni4" "$ip4" "$pp" "$bw1" "$bw8"
  {
    echo "ni_8B_us $ni8"
    echo "ip_8B_us $ip8"
    echo "ni_4MiB_Mbps $ni4"
    echo "ip_4MiB_Mbps $ip4"
    echo "pingpong_8B_us $pp"
    echo "rdma_bw_w1_Mbps $bw1"
    echo "rdma_bw_w8_Mbps $bw8"
    awk -v n="$ni8" -v p="$pp" 'BEGIN { printf "ratio_ni_8B_over_pingpong %.3f\n", n / p }'
    awk -v n="$ni4" -v w="$bw1" 'BEGIN { printf "ratio_ni_4MiB_over_rdma_bw_w1 %.3f\n", n / w }'
    awk -v n="$ni4" -v w="$bw8" 'BEGIN { printf "ratio_ni_4MiB_over_rdma_bw_w8 %.3f\n", n / w }'
    awk -v n="$ni8" -v i="$ip8" 'BEGIN { printf "ratio_ni_8B_over_ip %.3f\n", n / i }'
  } >>"$results"
done

echo
for fig in $(awk '{ print $1 }' "$results" | awk '!seen[$0]++'); do
  awk -v f="$fig" '$1 == f { print $2 }' "$results" | sort -g | awk -v f="$fig" '
    { v[NR] = $1 }
    END {
      m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
      printf "%-32s min %s / median %s / max %s\n", f, v[1], m, v[NR]
    }'
done
