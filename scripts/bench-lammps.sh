#!/usr/bin/env bash
# Debian's LAMMPS, unmodified, on 8 nodes of two QFDBs: over the NI (the libfabric
# provider, `exactl mpirun --fabric ni`), over IP over ExaNet (`--fabric ip`) and on the
# host alone (Open MPI's shared memory), alternated per round so that a noisy machine
# affects all alike. Runs LAMMPS's `melt` and `peptide` examples (without their dumps);
# prints each run's loop time, each figure's min/median/max, the ratios to the host run
# (issue target: melt over the NI <= 3x the host), and checks that every run printed the
# same thermodynamics as the host run.
# Needs root, /dev/net/tun, Debian's openmpi-bin, lammps and lammps-examples, and release
# builds (built here if missing).
# Usage: scripts/bench-lammps.sh [ROUNDS] [EXAMPLE...]   (default: 3 melt peptide)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
case $rounds in '' | *[!0-9]* | 0) echo "bench-lammps: ROUNDS must be a positive number" >&2; exit 2 ;; esac
shift || true
examples=("$@")
[ ${#examples[@]} -gt 0 ] || examples=(melt peptide)
[ "$(id -u)" = 0 ] || { echo "bench-lammps: needs root (network namespaces)" >&2; exit 2; }
bin=$PWD/target/release
for b in exanetd exactl exanet-ip libexanet_fi.so; do
  [ -e "$bin/$b" ] || cargo build --release -q -p exanetd -p exactl -p exanet-ip -p exanet-fi
done
command -v mpirun.openmpi >/dev/null && command -v lmp >/dev/null ||
  { echo "bench-lammps: needs Open MPI and LAMMPS (apt-get install openmpi-bin lammps lammps-examples)" >&2; exit 2; }
src=/usr/share/lammps/examples
for e in "${examples[@]}"; do
  [ -e "$src/$e/in.$e" ] || { echo "bench-lammps: no $src/$e/in.$e (apt-get install lammps-examples)" >&2; exit 2; }
done

rack=$(mktemp -d /tmp/exanet-bench-lammps.XXXXXX)
work=$(mktemp -d /tmp/exanet-bench-lammps-work.XXXXXX)
export EXANET_RACK=$rack EXANET_DAEMON=$bin/exanetd EXANET_IP=$bin/exanet-ip
cleanup() {
  "$bin/exactl" --rack "$rack" rack down >/dev/null 2>&1 || true
  rm -rf "$rack" "$work"
}
trap cleanup EXIT

if ! up=$(RUST_LOG=warn "$bin/exactl" --rack "$rack" rack up --shape 2x1x1 --ip on 2>&1); then
  printf '%s\n' "$up" >&2
  exit 1
fi
# Every example in a directory of its own (they read their data files by relative name),
# its dump commands commented out: the runs time the dynamics, not the disk.
for e in "${examples[@]}"; do
  mkdir -p "$work/$e"
  cp -r "$src/$e/." "$work/$e/"
  sed -i 's/^\(dump\|dump_modify\)/#\1/' "$work/$e/in.$e"
done
nodes=M1QAF1,M1QAF2,M1QAF3,M1QAF4,M1QBF1,M1QBF2,M1QBF3,M1QBF4

# run WHERE EXAMPLE ROUND: one LAMMPS run; prints its loop time in seconds and keeps its
# thermodynamics (the lines from the first "Step" to each "Loop time", without the CPU
# seconds that thermo_style multi prints) for the check.
run() {
  local where=$1 e=$2 r=$3 log=$work/$e.$1.$3.log
  local cmd
  case $where in
    host) cmd=(mpirun.openmpi --allow-run-as-root --oversubscribe -np 8) ;;
    *) cmd=("$bin/exactl" --rack "$rack" mpirun --fabric "$where" --nodes "$nodes" --) ;;
  esac
  (cd "$work/$e" && timeout -k 10 900 "${cmd[@]}" lmp -in "in.$e" -log none >"$log" 2>&1) || {
    echo "bench-lammps: $e over $where failed:" >&2
    tail -5 "$log" >&2
    exit 1
  }
  awk '/Step/{t=1} /^Loop time/{t=0} t' "$log" | sed 's/CPU = *[0-9.]* (sec)//' >"$work/$e.$where.$r.thermo"
  awk '/^Loop time of/{print $4; exit}' "$log"
}

stats() { sort -g | awk '{v[NR]=$1} END{printf "%.3f / %.3f / %.3f", v[1], v[int((NR+1)/2)], v[NR]}'; }

for e in "${examples[@]}"; do
  : >"$work/$e.times"
  for r in $(seq 1 "$rounds"); do
    h=$(run host "$e" "$r")
    n=$(run ni "$e" "$r")
    i=$(run ip "$e" "$r")
    echo "$e round $r: host $h s, ni $n s, ip $i s"
    echo "$h $n $i" >>"$work/$e.times"
    for where in ni ip; do
      cmp -s "$work/$e.host.$r.thermo" "$work/$e.$where.$r.thermo" || {
        echo "bench-lammps: $e over $where printed other thermodynamics than on the host:" >&2
        diff "$work/$e.host.$r.thermo" "$work/$e.$where.$r.thermo" | head -10 >&2
        exit 1
      }
    done
  done
  echo "$e loop time, s (min / median / max of $rounds):"
  echo "  host:               $(awk '{print $1}' "$work/$e.times" | stats)"
  echo "  over the NI:        $(awk '{print $2}' "$work/$e.times" | stats)"
  echo "  over IP over ExaNet: $(awk '{print $3}' "$work/$e.times" | stats)"
  echo "  ni / host:          $(awk '{print $2 / $1}' "$work/$e.times" | stats)"
  echo "  ip / host:          $(awk '{print $3 / $1}' "$work/$e.times" | stats)"
  echo "  thermodynamics: identical in every run"
done
