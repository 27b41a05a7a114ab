#!/usr/bin/env bash
# IP over ExaNet against the NI's own figures, on the same node pairs, alternated per round
# so that a noisy machine affects both alike:
#   ping RTT p50 (ping -c 200) vs exanet-perf pingpong round trip (64 B), 1 and 3 torus hops;
#   iperf3 TCP and UDP throughput vs exanet-perf rdma-bw (1 MiB writes), 1 and 3 torus hops.
# Needs root, /dev/net/tun, ping, iperf3 and release builds:
#   cargo build --release -p exanetd -p exactl -p exanet-perf -p exanet-ip
# Usage: [MTU=N] scripts/bench-ip.sh [ROUNDS]   (MTU: the nodes' [ip] mtu, default the rack's)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
bin=$PWD/target/release
rack=$(mktemp -d /tmp/exanet-bench-ip.XXXX)
export EXANET_RACK=$rack EXANET_DAEMON=$bin/exanetd EXANET_IP=$bin/exanet-ip
cleanup() { "$bin/exactl" rack down >/dev/null 2>&1 || true; rm -rf "$rack"; }
trap cleanup EXIT
if [ -n "${MTU:-}" ]; then
  # The MTU is the rack file's ([ip] mtu): make the file, set it, then bring the rack up.
  "$bin/exactl" rack up --shape 6x1x1 --ip off >/dev/null 2>&1
  "$bin/exactl" rack down >/dev/null 2>&1
  printf '\n[ip]\nmtu = %s\n' "$MTU" >>"$rack/rack.toml"
fi
"$bin/exactl" rack up --shape 6x1x1 --ip on >/dev/null
# 1 torus hop: M1QAF1 -> M1QBF1; 3 torus hops: M1QAF1 -> M1QDF1 (F1s are the torus routers).
pairs=("M1QAF1 M1QBF1 10.200.0.5" "M1QAF1 M1QDF1 10.200.0.13")
ex() { "$bin/exactl" exec "$@"; }
for round in $(seq "$rounds"); do
  for p in "${pairs[@]}"; do
    read -r a b addr <<<"$p"
    EXANET_NODE=$b "$bin/exanet-perf" pingpong serve >/dev/null 2>&1 &
    srv=$!
    sleep 0.5
    pp=$(EXANET_NODE=$a "$bin/exanet-perf" pingpong run --peer "$b" --sizes 64 --iterations 2000 --json 2>/dev/null \
      | python3 -c 'import json,sys; d=json.loads(sys.stdin.readline()); print(2*d["p50_us"])')
    bw=$(EXANET_NODE=$a "$bin/exanet-perf" rdma-bw run --peer "$b" --sizes 1M --iterations 200 --json 2>/dev/null \
      | python3 -c 'import json,sys; d=json.loads(sys.stdin.readline()); print(d["gbps"])')
    kill $srv 2>/dev/null; wait $srv 2>/dev/null || true
    rtt=$(ex "$a" -- ping -c 200 -i 0.005 -q "$addr" | awk -F/ '/rtt/ {print $5*1000}')
    ex "$b" -- iperf3 -s -1 -D
    sleep 0.3
    tcp=$(ex "$a" -- iperf3 -c "$addr" -t 5 -J | python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/1e9)')
    ex "$b" -- iperf3 -s -1 -D
    sleep 0.3
    udp=$(ex "$a" -- iperf3 -c "$addr" -u -b 0 -l $((${MTU:-65000} - 100)) -t 5 -J | python3 -c 'import json,sys; e=json.load(sys.stdin)["end"]; r=e.get("sum_received"); s=e["sum"]; print((r["bits_per_second"] if r else s["bits_per_second"]*(1-s.get("lost_percent",0)/100))/1e9)')
    echo "round $round $a->$b: pingpong_rtt_us=$pp ping_rtt_avg_us=$rtt rdma_bw_gbps=$bw iperf3_tcp_gbps=$tcp iperf3_udp_gbps=$udp"
  done
done
