#!/usr/bin/env bash
# Two builds of the project on the same machine under MPI programs over IP over ExaNet,
# alternated per round so that both share its noise. Each round and build brings up a fresh
# 2x1x1 rack with IP and runs
#   NetPIPE (NPopenmpi) 8 B (-n 3000) and 1 MiB (-n 20), M1QAF1 <-> M1QBF1: one-way us, Mb/s;
#   LAMMPS melt (Debian's example input), 4 ranks on M1QAF1, M1QAF3, M1QBF1, M1QBF3: loop s.
# Prints one line per run and min/median/max per build and figure.
#
#   scripts/bench-ab-apps.sh OLD_TREE NEW_TREE [ROUNDS]      (default 3 rounds)
#
# Each tree is a checkout with release binaries (cargo build --release -p exanetd -p exactl
# -p exanet-ip), e.g. an older commit's: git worktree add /tmp/old REV. Needs root and
# Debian's openmpi-bin netpipe-openmpi lammps lammps-examples.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 OLD_TREE NEW_TREE [ROUNDS]" >&2; exit 2; }
old=$(cd "$1" && pwd)
new=$(cd "$2" && pwd)
rounds=${3:-3}
case $rounds in '' | *[!0-9]* | 0) echo "bench-ab-apps: ROUNDS must be a positive number" >&2; exit 2 ;; esac
[ "$(id -u)" = 0 ] || { echo "bench-ab-apps: needs root (network namespaces)" >&2; exit 2; }
for t in NPopenmpi lmp; do
  command -v "$t" >/dev/null || { echo "bench-ab-apps: $t is missing (apt-get install netpipe-openmpi lammps)" >&2; exit 2; }
done
melt=/usr/share/lammps/examples/melt/in.melt
[ -f "$melt" ] || { echo "bench-ab-apps: $melt is missing (apt-get install lammps-examples)" >&2; exit 2; }
for t in "$old" "$new"; do
  for b in exanetd exactl exanet-ip; do
    [ -x "$t/target/release/$b" ] || { echo "bench-ab-apps: $t/target/release/$b is not built" >&2; exit 2; }
  done
done
work=$(mktemp -d /tmp/exanet-bench-ab-apps.XXXXXX)
rack=$work/rack
results=$work/results
bin=
cleanup() {
  [ -n "$bin" ] && "$bin/exactl" --rack "$rack" rack down >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
cp "$melt" "$work/"
cd "$work"

for round in $(seq "$rounds"); do
  for t in "$old" "$new"; do
    bin=$t/target/release
    name=old
    [ "$t" = "$new" ] && name=new
    rm -rf "$rack"
    if ! up=$(EXANET_DAEMON=$bin/exanetd EXANET_IP=$bin/exanet-ip RUST_LOG=warn \
      "$bin/exactl" --rack "$rack" rack up --shape 2x1x1 --ip on 2>&1); then
      printf '%s\n' "$up" >&2
      exit 1
    fi
    mpirun() { timeout -k 10 300 "$bin/exactl" --rack "$rack" mpirun "$@"; }
    rm -f np8.out np1m.out
    mpirun --nodes M1QAF1,M1QBF1 -- NPopenmpi -l 8 -u 8 -n 3000 -p 0 -o "$work/np8.out" >np.log 2>&1 || true
    mpirun --nodes M1QAF1,M1QBF1 -- NPopenmpi -l 1048576 -u 1048576 -n 20 -p 0 -o "$work/np1m.out" >>np.log 2>&1 || true
    mpirun --nodes M1QAF1,M1QAF3,M1QBF1,M1QBF3 -- lmp -in in.melt >melt.log 2>&1 || true
    lat=$(awk '$1 == 8 { printf "%.1f", $3 * 1e6 }' np8.out 2>/dev/null || true)
    bw=$(awk '$1 == 1048576 { printf "%.0f", $2 }' np1m.out 2>/dev/null || true)
    loop=$(awk '/^Loop time/ { print $4 }' melt.log)
    for v in "$lat" "$bw" "$loop"; do
      [ -n "$v" ] || { echo "bench-ab-apps: round $round ($name) gave no figure; see:" >&2; tail -5 np.log melt.log >&2; exit 1; }
    done
    echo "round $round $name: NetPIPE 8 B one-way $lat us, 1 MiB $bw Mb/s; LAMMPS melt loop $loop s"
    printf '%s netpipe_8B_one_way_us %s\n%s netpipe_1MiB_mbps %s\n%s lammps_melt_loop_s %s\n' \
      "$name" "$lat" "$name" "$bw" "$name" "$loop" >>"$results"
    "$bin/exactl" --rack "$rack" rack down >/dev/null 2>&1 || true
  done
done

echo
printf '%-28s %-4s %10s %10s %10s\n' figure build min median max
for fig in netpipe_8B_one_way_us netpipe_1MiB_mbps lammps_melt_loop_s; do
  for name in old new; do
    awk -v f="$fig" -v n="$name" '$1 == n && $2 == f { print $3 }' "$results" | sort -g |
      awk -v f="$fig" -v n="$name" '{ v[NR] = $1 } END {
        printf "%-28s %-4s %10s %10s %10s\n", f, n, v[1], v[int((NR + 1) / 2)], v[NR] }'
  done
done
