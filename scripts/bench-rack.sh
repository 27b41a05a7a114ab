#!/usr/bin/env bash
# Benchmark of a local rack of daemons (IP over ExaNet off: as root it would be on, and a
# 1024-node rack with IP does not fit a small host): time from `exactl rack up` to every
# link up, idle CPU of the
# whole rack over a window, and resident memory per daemon.
#
#   scripts/bench-rack.sh [SHAPE] [IDLE_SECONDS] [LINK_TIMEOUT_S]   (default 4x4x2, 10, the rack's default)
#
# LINK_TIMEOUT_S is `rack up --link-timeout`: keep-alives, an idle rack's main cost, go at
# under a third of it.
#
# Builds release binaries first. Prints one line per figure.
set -euo pipefail
shape=${1:-4x4x2}
idle=${2:-10}
link_timeout=()
[ -n "${3:-}" ] && link_timeout=(--link-timeout "$3")
cd "$(dirname "$0")/.."
cargo build --release -q -p exanetd -p exactl
bin=${CARGO_TARGET_DIR:-target}/release
dir=$(mktemp -d /tmp/exanet-bench-rack.XXXXXX)
trap '"$bin/exactl" --rack "$dir" rack down >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT

t0=$(date +%s.%N)
RUST_LOG=warn "$bin/exactl" --rack "$dir" rack up --shape "$shape" --ip off --timeout 120 "${link_timeout[@]}" >/dev/null
t1=$(date +%s.%N)
awk -v a="$t0" -v b="$t1" -v s="$shape" 'BEGIN { printf "rack up %s: all links up in %.2f s\n", s, b - a }'

pids=$(cat "$dir"/run/*.pid)
n=$(echo "$pids" | wc -w)
ticks() { local s=0; for p in $pids; do set -- $(cut -d' ' -f14,15 "/proc/$p/stat"); s=$((s + $1 + $2)); done; echo $s; }
sleep 2 # let the rack settle after bring-up
c0=$(ticks); w0=$(date +%s.%N)
sleep "$idle"
c1=$(ticks); w1=$(date +%s.%N)
hz=$(getconf CLK_TCK)
echo "$c0 $c1 $w0 $w1 $hz $n" | awk '{ cpu = ($2 - $1) / $5; wall = $4 - $3;
  printf "idle rack (%d daemons): %.2f%% of one core in total over %.1f s\n", $6, 100 * cpu / wall, wall }'
for p in $pids; do awk '/VmRSS/ {print $2}' "/proc/$p/status"; done | sort -n | awk '
  { v[NR] = $1; s += $1 } END { printf "RSS per daemon: median %.1f MiB, max %.1f MiB, total %.0f MiB\n", v[int((NR+1)/2)]/1024, v[NR]/1024, s/1024 }'
