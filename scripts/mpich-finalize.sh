#!/usr/bin/env bash
# MPICH's MPI_Finalize over UCX's TCP transport, with no exanet at all: RUNS runs of an
# 8-rank program on this host's loopback, then the same on a rack (with -r). Counts the
# runs that ended by themselves and those that hung after the program's work (ended by
# Hydra's MPIEXEC_TIMEOUT). Shows whether a hang of `exactl mpirun --mpi mpich` is the
# MPI library's (Debian 12's MPICH 4.0.2 hangs on the bare host too) or the rack's.
# Needs mpich and libmpich-dev (and for -r: root, /dev/net/tun, release builds:
#   cargo build --release -p exanetd -p exactl -p exanet-ip).
# Usage: scripts/mpich-finalize.sh [-r] [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
on_rack=0
if [ "${1:-}" = -r ]; then on_rack=1; shift; fi
runs=${1:-10}
work=$(mktemp -d /tmp/exanet-mpich.XXXX)
bin=$PWD/target/release
cleanup() {
  if [ $on_rack = 1 ]; then "$bin/exactl" --rack "$work/rack" rack down >/dev/null 2>&1 || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
cat >"$work/p.c" <<'C'
#include <mpi.h>
#include <stdio.h>
int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size, sum = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) { printf("work done: %s\n", sum == size * (size - 1) / 2 ? "ok" : "WRONG"); fflush(stdout); }
    MPI_Finalize();
    return 0;
}
C
mpicc.mpich -O2 -o "$work/p" "$work/p.c"
if [ $on_rack = 1 ]; then
  "$bin/exactl" --rack "$work/rack" rack up --shape 2x1x1 --ip on >/dev/null
  run() { "$bin/exactl" --rack "$work/rack" mpirun --mpi mpich -np 8 -- "$work/p"; }
  where="a 2x1x1 rack, one rank per node"
else
  run() { UCX_TLS=tcp,self UCX_NET_DEVICES=lo mpiexec.hydra -n 8 "$work/p"; }
  where="this host's loopback, no exanet"
fi
ended=0 hung=0 other=0
for _ in $(seq "$runs"); do
  out=$(MPIEXEC_TIMEOUT=15 run 2>&1) && rc=0 || rc=$?
  if [ $rc = 0 ]; then ended=$((ended + 1))
  elif grep -q "work done: ok" <<<"$out" && grep -q "APPLICATION TIMED OUT" <<<"$out"; then hung=$((hung + 1))
  else other=$((other + 1)); printf '%s\n' "$out" | tail -5 >&2
  fi
done
echo "MPICH $(mpichversion 2>/dev/null | sed -n 's/MPICH Version:\s*//p'), 8 ranks over UCX TCP on $where:"
echo "  $ended of $runs ended by themselves; $hung hung in MPI_Finalize after the work; $other failed otherwise"
