#!/usr/bin/env bash
# An idle rack with IP over ExaNet: what it takes when nothing runs on it. Brings the rack
# up (root: IP on), waits for it to settle, then prints
#   - the rise of Shmem in /proc/meminfo since before `rack up` (the IP services'
#     registered memory is memfd memory: it shows there);
#   - the bytes of receive rings the IP services registered (exanet_ip_registered_bytes,
#     summed over the nodes; 0 when no node has sent to another);
#   - the CPU of every daemon and IP service over a window, as a share of one core.
# Needs root, /dev/net/tun, curl and release builds:
#   cargo build --release -p exanetd -p exactl -p exanet-ip
# Usage: scripts/bench-idle.sh [SHAPE] [IDLE_SECONDS]   (default 4x4x2, 20)
set -euo pipefail
shape=${1:-4x4x2}
idle=${2:-20}
case $idle in '' | *[!0-9]* | 0) echo "bench-idle: IDLE_SECONDS must be a positive number" >&2; exit 2 ;; esac
cd "$(dirname "$0")/.."
bin=${CARGO_TARGET_DIR:-target}/release
for b in exanetd exactl exanet-ip; do
  [ -x "$bin/$b" ] || { echo "bench-idle: $bin/$b is not built (cargo build --release -p $b)" >&2; exit 2; }
done
command -v curl >/dev/null || { echo "bench-idle: needs curl" >&2; exit 2; }
dir=$(mktemp -d /tmp/exanet-bench-idle.XXXXXX)
trap '"$bin/exactl" --rack "$dir" rack down >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT

shmem() { awk '/^Shmem:/ { printf "%d\n", $2 * 1024 }' /proc/meminfo; }
s0=$(shmem)
t0=$(date +%s.%N)
EXANET_DAEMON=$bin/exanetd RUST_LOG=warn "$bin/exactl" --rack "$dir" rack up --shape "$shape" --ip on >/dev/null
t1=$(date +%s.%N)
sleep 8 # let the rack settle after bring-up
s1=$(shmem)

# A pid file holds the pid first (an IP service's also its program).
pids=$(for f in "$dir"/run/*.pid "$dir"/run/ip/*.pid; do read -r p _ <"$f"; echo "$p"; done)
n=$(echo "$pids" | wc -w)
ticks() { local s=0; for p in $pids; do set -- $(cut -d' ' -f14,15 "/proc/$p/stat"); s=$((s + $1 + $2)); done; echo $s; }
c0=$(ticks); w0=$(date +%s.%N)
sleep "$idle"
c1=$(ticks); w1=$(date +%s.%N)

rings=0
for f in "$dir"/run/ip/*.ready; do
  addr=$(cut -d' ' -f3 "$f")
  v=$(curl -fsS "http://$addr/metrics" | awk '/^exanet_ip_registered_bytes/ { print $2 }')
  rings=$((rings + ${v:-0}))
done

awk -v a="$t0" -v b="$t1" -v s="$shape" 'BEGIN { printf "rack up %s with IP: %.2f s\n", s, b - a }'
echo "$s0 $s1" | awk '{ printf "Shmem rose by %.1f MiB\n", ($2 - $1) / 1048576 }'
echo "receive rings registered by the IP services: $rings bytes"
echo "$c0 $c1 $w0 $w1 $(getconf CLK_TCK) $n" | awk '{ printf "idle CPU of %d processes (daemons and IP services): %.2f%% of one core over %.1f s\n", $6, ($2 - $1) / $5 / ($4 - $3) * 100, $4 - $3 }'
