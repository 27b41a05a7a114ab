#!/usr/bin/env bash
# MPI collectives in modeled time through the libfabric provider, against the report's
# figures (section 6.1.3 and 6.1.5): Open MPI's own MPI_Allreduce and MPI_Bcast, timed by
# the program with MPI_Wtime under `exactl mpirun --modeled` (scripts/mpi-collectives.c),
# on a 4x1x1 rack (16 nodes) of release daemons in modeled order, with IP over ExaNet for
# the MPI runtime (root). COMPUTE_SCALE ([model] compute_scale) says what Open MPI's own
# processing between its calls into the provider costs: its thread's CPU time on this host
# times the scale (1: as measured here; 0: nothing, so only the NI and the links count).
# Needs: cargo build --release -p exanetd -p exactl -p exanet-fi; openmpi-bin libopenmpi-dev.
# Usage: [COMPUTE_SCALE=0] [ITER=20] [ORDER=modeled|host] scripts/bench-mpi-collectives.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$PWD/target/release
scale=${COMPUTE_SCALE:-0}
iter=${ITER:-20}
order=${ORDER:-modeled}
export EXANET_DAEMON=$bin/exanetd
work=$(mktemp -d /tmp/exanet-bench-mpicoll.XXXX)
rack=$work/rack
cleanup() {
  EXANET_RACK=$rack "$bin/exactl" rack down >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
mpicc.openmpi -O2 -o "$work/mpi-collectives" scripts/mpi-collectives.c
EXANET_RACK=$rack "$bin/exactl" rack up --shape 4x1x1 --ip off >/dev/null 2>&1
EXANET_RACK=$rack "$bin/exactl" rack down >/dev/null 2>&1
printf '\n[model]\norder = "%s"\ncompute_scale = %s\n' "$order" "$scale" >>"$rack/rack.toml"
EXANET_RACK=$rack "$bin/exactl" rack up --ip on >/dev/null
echo "Open MPI through the provider; $order order; compute_scale $scale; $iter iterations"
printf '%-36s %9s  %s\n' what report "modeled us (min / mean / max of the slowest rank)"
row() {
  local what=$1 report=$2 np=$3
  shift 3
  local out
  out=$(EXANET_RACK=$rack timeout 900 "$bin/exactl" mpirun --modeled -np "$np" -- \
    "$work/mpi-collectives" "$@" "$iter" 5 2>&1 | tail -1)
  printf '%-36s %9s  %s\n' "$what" "$report" "${out#*: }"
}
row "allreduce 8 B, 4 ranks of one QFDB" 5.34 4 allreduce 8
row "allreduce 64 B, 4 ranks of one QFDB" 33.62 4 allreduce 64
row "bcast 1 B, 4 ranks" 1.93 4 bcast 1
row "allreduce 256 B, 16 ranks" 39.7 16 allreduce 256
