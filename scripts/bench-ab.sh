#!/usr/bin/env bash
# A/B benchmark of two builds of the project on the same machine, alternating them so
# that both share its noise: for each round and each build, the link benchmark (two
# daemons, one link: cell throughput and probe RTT), then on a fresh 2x1x1 local rack
# exanet-perf pingpong (64 B, M1QAF2 -> M1QBF3) and rdma-bw (4 MiB writes, window 4,
# verified). Prints one line per run and min/median/max per build and figure, with the
# new build's median as a ratio of the old one's.
#
#   scripts/bench-ab.sh OLD_TREE NEW_TREE [ROUNDS]      (default 3 rounds)
#
# Each tree is a checkout with release binaries built (cargo build --release -p exanetd -p exanet-ip
# -p exactl -p exanet-perf) and the link benchmark built (cargo bench --no-run -p exanetd
# --bench link). For example, the tree of an older commit: git worktree add /tmp/old REV.
set -euo pipefail
old=$(cd "$1" && pwd)
new=$(cd "$2" && pwd)
rounds=${3:-3}
results=$(mktemp)
dir=
cleanup() {
  if [ -n "$dir" ]; then
    [ -n "${server:-}" ] && kill "$server" 2>/dev/null
    "$bin/exactl" --rack "$dir" rack down >/dev/null 2>&1 || true
    rm -rf "$dir"
  fi
  rm -f "$results"
}
trap cleanup EXIT

# The newest link benchmark binary of a tree.
link_bench() {
  ls -t "$1"/target/release/deps/link-* 2>/dev/null | grep -v '\.d$' | head -1
}

for t in "$old" "$new"; do
  for b in exanetd exactl exanet-perf exanet-ip; do
    [ -x "$t/target/release/$b" ] || { echo "bench-ab: $t/target/release/$b is not built" >&2; exit 2; }
  done
  [ -n "$(link_bench "$t")" ] || { echo "bench-ab: no link benchmark built in $t" >&2; exit 2; }
done

for round in $(seq "$rounds"); do
  for t in "$old" "$new"; do
    name=$([ "$t" = "$old" ] && echo old || echo new)
    bin=$t/target/release
    # The link benchmark prints "probe rtt, 1 hop: p50 X us, ..." and "throughput, 1 link,
    # 256 B cells: X Gb/s payload, ...".
    out=$(cd "$t/exanetd" && CELLS=1000000 PINGS=1000 "$(link_bench "$t")" --bench 2>&1) || true
    gbps=$(printf '%s\n' "$out" | sed -n 's/^throughput.*cells: \([0-9.]*\) Gb\/s payload.*/\1/p' | head -1)
    rtt=$(printf '%s\n' "$out" | sed -n 's/^probe rtt, 1 hop: p50 \([0-9.]*\) us.*/\1/p' | head -1)
    dir=$(mktemp -d /tmp/exanet-bench-ab.XXXXXX)
    if ! up=$(RUST_LOG=warn "$bin/exactl" --rack "$dir" rack up --shape 2x1x1 --timeout 60 2>&1); then
      printf '%s\n' "$up" >&2
      exit 1
    fi
    "$bin/exanet-perf" --rack "$dir" --node M1QBF3 pingpong serve >/dev/null 2>&1 &
    server=$!
    pp=$("$bin/exanet-perf" --rack "$dir" --node M1QAF2 pingpong run --peer M1QBF3 --quiet \
      --sizes 64 --iterations 2000 --json 2>/dev/null | sed -n 's/.*"p50_us": *\([0-9.]*\).*/\1/p' | head -1)
    kill "$server" 2>/dev/null; wait "$server" 2>/dev/null || true
    "$bin/exanet-perf" --rack "$dir" --node M1QBF3 rdma-bw serve >/dev/null 2>&1 &
    server=$!
    bw=$("$bin/exanet-perf" --rack "$dir" --node M1QAF2 rdma-bw run --peer M1QBF3 --quiet \
      --sizes 4M --iterations 16 --window 4 --verify --json 2>/dev/null \
      | sed -n 's/.*"gbps": *\([0-9.]*\).*/\1/p' | head -1)
    kill "$server" 2>/dev/null; wait "$server" 2>/dev/null || true
    server=
    "$bin/exactl" --rack "$dir" rack down >/dev/null 2>&1 || true
    rm -rf "$dir"
    dir=
    printf 'round %s %s: link %s Gb/s, probe RTT p50 %s us; pingpong 64 B p50 %s us; rdma-bw 4 MiB %s Gb/s\n' \
      "$round" "$name" "${gbps:-?}" "${rtt:-?}" "${pp:-?}" "${bw:-?}"
    printf '%s link_gbps %s\n%s probe_rtt_us %s\n%s pingpong_p50_us %s\n%s rdma_bw_gbps %s\n' \
      "$name" "${gbps:-nan}" "$name" "${rtt:-nan}" "$name" "${pp:-nan}" "$name" "${bw:-nan}" >>"$results"
  done
done

# Median of a figure for one build ("nan" when it has no result).
median() {
  awk -v n="$1" -v f="$2" '$1 == n && $2 == f && $3 != "nan" { print $3 }' "$results" | sort -g |
    awk '{ v[NR] = $1 } END { print (NR ? v[int((NR + 1) / 2)] : "nan") }'
}

for fig in link_gbps probe_rtt_us pingpong_p50_us rdma_bw_gbps; do
  for name in old new; do
    awk -v n="$name" -v f="$fig" '$1 == n && $2 == f && $3 != "nan" { print $3 }' "$results" | sort -g |
      awk -v n="$name" -v f="$fig" '{ v[NR] = $1 } END {
        if (NR == 0) { printf "%-16s %s: no result\n", f, n; exit }
        printf "%-16s %s: min %s / median %s / max %s\n", f, n, v[1], v[int((NR + 1) / 2)], v[NR] }'
  done
  awk -v o="$(median old "$fig")" -v w="$(median new "$fig")" -v f="$fig" 'BEGIN {
    if (o != "nan" && w != "nan" && o > 0) printf "%-16s new/old median ratio %.2f\n", f, w / o }'
done
