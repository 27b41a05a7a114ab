#!/usr/bin/env bash
# Benchmark of a compose rack on this host, one container per node: time from
# `docker-compose up` to every link up, memory, idle CPU.
#
#   scripts/bench-compose.sh [SHAPE] [IDLE_SECONDS]      (default 4x4x2, 10)
#
# Builds the image offline (docker/build.sh; EXANET_SKIP_BUILD=1 to reuse exanet:latest),
# generates the rack with `exactl rack compose` on its own subnet and project name (a rack
# already up on this host is not disturbed), starts the node services, measures, and takes
# it down with its volumes. Prints one line per figure.
set -euo pipefail
shape=${1:-4x4x2}
idle=${2:-10}
subnet=${EXANET_BENCH_SUBNET:-10.218.0.0/16}
cd "$(dirname "$0")/.."
root=$PWD
if [ "${EXANET_SKIP_BUILD:-}" != 1 ]; then
  docker/build.sh >/dev/null
fi
cargo build --release -q -p exactl
bin=${CARGO_TARGET_DIR:-target}/release
dir=$(mktemp -d /tmp/exanet-bench-compose.XXXXXX)
project=exanet-bench-$$
dc() { docker-compose -p "$project" "$@"; }
cleanup() {
  (cd "$dir" && dc down -v -t 5 >/dev/null 2>&1) || true
  rm -rf "$dir"
}
trap cleanup EXIT

"$bin/exactl" rack compose --shape "$shape" --subnet "$subnet" --name "$project" --out "$dir" >/dev/null
cd "$dir"
mapfile -t metrics < <(awk -F'"' '/^metrics = / { print $2 }' rack/rack.toml)
nodes=$(dc config --services | grep -v -x -e prometheus -e grafana -e pki)
n=${#metrics[@]}

ready() {
  local ok=0
  for m in "${metrics[@]}"; do
    if [ "$(curl -s -o /dev/null -m 2 -w '%{http_code}' "http://$m/ready")" = 200 ]; then
      ok=$((ok + 1))
    fi
  done
  echo "$ok"
}

t0=$(date +%s.%N)
# The generated .env sets COMPOSE_PARALLEL_LIMIT above the number of services.
RUST_LOG=warn timeout 480 docker-compose -p "$project" up -d pki $nodes >/dev/null 2>"$dir/up.log" ||
  { tail -5 "$dir/up.log" >&2; echo "bench-compose: docker-compose up failed or hung (see above)" >&2; exit 1; }
t_up=$(date +%s.%N)
deadline=$(( $(date +%s) + 600 ))
while [ "$(ready)" != "$n" ]; do
  if [ "$(date +%s)" -gt "$deadline" ]; then
    echo "bench-compose: the rack did not come up within 600 s ($(ready) of $n nodes ready)" >&2
    exit 1
  fi
  sleep 1
done
t1=$(date +%s.%N)
awk -v a="$t0" -v u="$t_up" -v b="$t1" -v s="$shape" -v n="$n" 'BEGIN {
  printf "compose rack %s (%d containers): docker-compose up returned in %.1f s, all links up %.1f s after up started\n", s, n, u - a, b - a }'

ids=$(dc ps -q $nodes)
pids=$(docker inspect -f '{{.State.Pid}}' $ids)
shims=$(for p in $pids; do awk '{ print $4 }' "/proc/$p/stat"; done)
docker_pids="$(pgrep -x dockerd || true) $(pgrep -x containerd || true)"
ticks() { local s=0; for p in "$@"; do set -- $(cut -d' ' -f14,15 "/proc/$p/stat" 2>/dev/null || echo "0 0"); s=$((s + $1 + $2)); done; echo $s; }
sleep 5 # let the rack settle after bring-up
d0=$(ticks $pids); s0=$(ticks $shims); e0=$(ticks $docker_pids); w0=$(date +%s.%N)
sleep "$idle"
d1=$(ticks $pids); s1=$(ticks $shims); e1=$(ticks $docker_pids); w1=$(date +%s.%N)
hz=$(getconf CLK_TCK)
awk -v d="$((d1 - d0))" -v s="$((s1 - s0))" -v e="$((e1 - e0))" -v a="$w0" -v b="$w1" -v hz="$hz" -v n="$n" 'BEGIN {
  w = b - a
  printf "idle rack over %.1f s: daemons %.2f%% of one core in total; container shims %.2f%%; dockerd+containerd (health checks) %.2f%%\n",
    w, 100 * d / hz / w, 100 * s / hz / w, 100 * e / hz / w }'
rss() { for p in "$@"; do awk '/VmRSS/ { print $2 }' "/proc/$p/status" 2>/dev/null; done; }
rss $pids | sort -n | awk '{ v[NR] = $1; s += $1 } END {
  printf "daemon RSS: median %.1f MiB, max %.1f MiB, total %.0f MiB\n", v[int((NR + 1) / 2)] / 1024, v[NR] / 1024, s / 1024 }'
rss $shims | awk '{ s += $1 } END { printf "containerd shims RSS: total %.0f MiB (%.1f MiB per container)\n", s / 1024, s / 1024 / NR }'
# Container memory as the kernel accounts it (cgroup v1 or v2), page cache included.
total=0
for id in $ids; do
  full=$(docker inspect -f '{{.Id}}' "$id")
  for f in /sys/fs/cgroup/memory/docker/$full/memory.usage_in_bytes /sys/fs/cgroup/system.slice/docker-$full.scope/memory.current; do
    if [ -r "$f" ]; then total=$((total + $(cat "$f"))); break; fi
  done
done
awk -v t="$total" 'BEGIN { if (t > 0) printf "container cgroups: %.0f MiB in total\n", t / 1048576 }'
t2=$(date +%s.%N)
dc down -v -t 5 >/dev/null 2>&1
t3=$(date +%s.%N)
awk -v a="$t2" -v b="$t3" 'BEGIN { printf "docker-compose down -v: %.1f s\n", b - a }'
cd "$root"
