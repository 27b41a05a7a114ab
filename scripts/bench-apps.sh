#!/usr/bin/env bash
# Unmodified MPI applications on the rack against the same ranks on this host, alternated per
# round (host first, then rack) so that a noisy machine affects both alike:
#   NetPIPE (NPopenmpi, 2 ranks: M1QAF1, M1QBF1, one torus hop): 8 B one-way latency and
#     1 MiB throughput; beside them exanet-perf pingpong's 8 B one-way p50 on the same pair,
#     the NI's own latency (the issue's target: NetPIPE within twice it);
#   hpcc (4 ranks: M1QAF1, M1QAF3, M1QBF1, M1QBF3; Debian's example hpccinf.txt, N = 1000):
#     wall time, average ping-pong latency and bandwidth, HPL GFlop/s;
#   LAMMPS melt and peptide (lmp, the same 4 ranks, or LAMMPS_RANKS = 8: every node of both
#     QFDBs; Debian's example inputs): loop time and wall time, and whether the last thermo
#     output before "Loop time" is the same on both.
# The host runs are `mpirun.openmpi -np N --oversubscribe` with Open MPI's defaults (shared
# memory between the ranks); the rack's are `exactl mpirun --fabric FABRIC --nodes ...`, one
# rank per node: FABRIC ni (the default) is the NI through the libfabric provider
# (docs/mpi.md), ip is TCP over IP over ExaNet (docs/ip.md "MPI").
# Prints a line per run, then each figure's min/median/max over the rounds and the median of
# the per-round ratios rack/host. A failed run says why; the script then exits 1 at the end.
# Needs root, /dev/net/tun, Debian's openmpi-bin netpipe-openmpi hpcc lammps lammps-examples,
# and release builds (built here if missing):
#   cargo build --release -p exanetd -p exactl -p exanet-ip -p exanet-perf -p exanet-fi
# Usage: scripts/bench-apps.sh [ROUNDS [FABRIC [LAMMPS_RANKS]]]   (default 1 ni 4)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-1}
fabric=${2:-ni}
lammps_ranks=${3:-4}
case $rounds in '' | *[!0-9]* | 0) echo "bench-apps: ROUNDS must be a positive number" >&2; exit 2 ;; esac
case $fabric in ni | ip) ;; *) echo "bench-apps: FABRIC must be ni or ip" >&2; exit 2 ;; esac
case $lammps_ranks in 4 | 8) ;; *) echo "bench-apps: LAMMPS_RANKS must be 4 or 8" >&2; exit 2 ;; esac
[ "$(id -u)" = 0 ] || { echo "bench-apps: needs root (network namespaces)" >&2; exit 2; }
bin=$PWD/target/release
for b in exanetd exactl exanet-ip exanet-perf libexanet_fi.so; do
  [ -e "$bin/$b" ] || cargo build --release -q -p exanetd -p exactl -p exanet-ip -p exanet-perf -p exanet-fi
done
for t in mpirun.openmpi NPopenmpi hpcc lmp; do
  command -v "$t" >/dev/null || { echo "bench-apps: $t is missing (apt-get install openmpi-bin netpipe-openmpi hpcc lammps)" >&2; exit 2; }
done
examples=/usr/share/lammps/examples
hpccinf=/usr/share/doc/hpcc/examples/_hpccinf.txt
for f in "$examples/melt/in.melt" "$examples/peptide/in.peptide" "$examples/peptide/data.peptide" "$hpccinf"; do
  [ -f "$f" ] || { echo "bench-apps: $f is missing (apt-get install lammps-examples hpcc)" >&2; exit 2; }
done

rack=$(mktemp -d /tmp/exanet-bench-apps.XXXXXX)
work=$(mktemp -d /tmp/exanet-bench-apps-work.XXXXXX)
results=$work/results
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

# The ranks run in $work (the nodes share this host's files): hpcc reads hpccinf.txt there,
# LAMMPS its inputs.
cp "$hpccinf" "$work/hpccinf.txt"
cp "$examples/melt/in.melt" "$examples/peptide/in.peptide" "$examples/peptide/data.peptide" "$work/"
cd "$work"

failed=0
nodes2=M1QAF1,M1QBF1
nodes4=M1QAF1,M1QAF3,M1QBF1,M1QBF3
nodes8=M1QAF1,M1QAF2,M1QAF3,M1QAF4,M1QBF1,M1QBF2,M1QBF3,M1QBF4
limit=600 # seconds one run may take before it counts as failed

# run WHERE NP LOG CMD...: runs CMD with NP ranks on the host or the rack, output in LOG;
# sets $wall (seconds). Returns non-zero (and says why) when the run fails.
run() {
  local where=$1 np=$2 log=$3 rc=0 t0 t1
  shift 3
  t0=$(date +%s.%N)
  if [ "$where" = host ]; then
    timeout -k 10 "$limit" mpirun.openmpi --allow-run-as-root -np "$np" --oversubscribe "$@" >"$log" 2>&1 || rc=$?
  else
    local nodes=$nodes4
    [ "$np" = 2 ] && nodes=$nodes2
    [ "$np" = 8 ] && nodes=$nodes8
    timeout -k 10 "$limit" "$bin/exactl" --rack "$rack" mpirun --fabric "$fabric" --nodes "$nodes" -- "$@" >"$log" 2>&1 || rc=$?
  fi
  t1=$(date +%s.%N)
  wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
  if [ "$rc" != 0 ]; then
    echo "FAILED: $where $* exited $rc after $wall s; the end of its output:" >&2
    tail -15 "$log" | sed 's/^/  | /' >&2
    failed=1
    return 1
  fi
}

record() { printf '%s %s\n' "$1" "$2" >>"$results"; }
ratio() { awk -v r="$1" -v h="$2" 'BEGIN { if (h > 0) printf "%.3g", r / h; else print "nan" }'; }

# The last thermo output before "Loop time": from the last "---- Step" header (thermo_style
# multi, several lines, its header's CPU time left out) or else the last line.
thermo() {
  awk '/^Loop time/ { exit } { lines[++n] = $0; if ($0 ~ /^-+ Step/) start = n } END {
    if (!start) start = n; for (i = start; i <= n; i++) print lines[i] }' "$1" |
    sed 's/ CPU = *[0-9.]* (sec) //' # the header's CPU time is not output to compare

}

netpipe() {
  local round=$1 where lat bw
  declare -A L B
  for where in host rack; do
    rm -f np.out
    run "$where" 2 "np-$where.log" NPopenmpi -l 8 -u 1048576 -p 0 -o "$work/np.out" || return 0
    # np.out: bytes, Mb/s, one-way seconds.
    lat=$(awk '$1 == 8 { printf "%.2f", $3 * 1e6 }' np.out)
    bw=$(awk '$1 == 1048576 { printf "%.3f", $2 / 1000 }' np.out)
    if [ -z "$lat" ] || [ -z "$bw" ]; then
      echo "FAILED: $where NetPIPE wrote no 8 B or 1 MiB line" >&2; failed=1; return 0
    fi
    L[$where]=$lat B[$where]=$bw
    record "netpipe_8B_one_way_us_$where" "$lat"
    record "netpipe_1MiB_gbps_$where" "$bw"
  done
  record "netpipe_8B_one_way_us_rack/host" "$(ratio "${L[rack]}" "${L[host]}")"
  record "netpipe_1MiB_gbps_rack/host" "$(ratio "${B[rack]}" "${B[host]}")"
  # The NI's own one-way latency on the same pair.
  local srv ni
  EXANET_NODE=M1QBF1 "$bin/exanet-perf" pingpong serve >pp-serve.log 2>&1 &
  srv=$!
  for _ in $(seq 200); do grep -q '^ready ' pp-serve.log && break; sleep 0.05; done
  ni=$(EXANET_NODE=M1QAF1 "$bin/exanet-perf" pingpong run --peer M1QBF1 --quiet --sizes 8 \
    --iterations 2000 --json 2>&1 | sed -n 's/.*"p50_us":\([0-9.e+-]*\).*/\1/p' | head -1) || true
  kill "$srv" 2>/dev/null || true
  wait "$srv" 2>/dev/null || true
  if [ -z "$ni" ]; then
    echo "FAILED: exanet-perf pingpong M1QAF1 -> M1QBF1 gave no figure" >&2; cat pp-serve.log >&2; failed=1; ni=0
  fi
  record "exanet_perf_8B_one_way_p50_us_rack" "$ni"
  record "netpipe_8B_one_way_us_rack/ni" "$(ratio "${L[rack]}" "$ni")"
  printf 'round %s NetPIPE: 8 B one-way host %s us, rack %s us (x%s; exanet-perf pingpong 8 B one-way p50 %s us, NetPIPE x%s of it); 1 MiB host %s Gb/s, rack %s Gb/s (x%s)\n' \
    "$round" "${L[host]}" "${L[rack]}" "$(ratio "${L[rack]}" "${L[host]}")" "$ni" "$(ratio "${L[rack]}" "$ni")" \
    "${B[host]}" "${B[rack]}" "$(ratio "${B[rack]}" "${B[host]}")"
}

hpcc_run() {
  local round=$1 where key
  declare -A W P G H
  for where in host rack; do
    rm -f hpccoutf.txt
    run "$where" 4 "hpcc-$where.log" hpcc || return 0
    key() { sed -n "s/^$1=//p" hpccoutf.txt | tail -1; }
    if [ "$(key Success)" != 1 ]; then
      echo "FAILED: $where hpcc did not report Success=1" >&2; tail -5 hpccoutf.txt >&2; failed=1; return 0
    fi
    W[$where]=$wall
    P[$where]=$(key AvgPingPongLatency_usec)
    G[$where]=$(awk -v b="$(key AvgPingPongBandwidth_GBytes)" 'BEGIN { printf "%.4f", b }')
    H[$where]=$(awk -v t="$(key HPL_Tflops)" 'BEGIN { printf "%.4f", t * 1000 }')
    record "hpcc_wall_s_$where" "${W[$where]}"
    record "hpcc_pingpong_avg_latency_us_$where" "${P[$where]}"
    record "hpcc_pingpong_avg_bw_GBps_$where" "${G[$where]}"
    record "hpcc_hpl_gflops_$where" "${H[$where]}"
    cp hpccoutf.txt "hpccoutf-$where.txt"
  done
  record "hpcc_wall_s_rack/host" "$(ratio "${W[rack]}" "${W[host]}")"
  printf 'round %s hpcc: wall host %s s, rack %s s (x%s); ping-pong avg latency host %s us, rack %s us; avg bandwidth host %s GB/s, rack %s GB/s; HPL host %s GFlop/s, rack %s GFlop/s\n' \
    "$round" "${W[host]}" "${W[rack]}" "$(ratio "${W[rack]}" "${W[host]}")" "${P[host]}" "${P[rack]}" \
    "${G[host]}" "${G[rack]}" "${H[host]}" "${H[rack]}"
}

lammps() {
  local round=$1 name=$2 where same
  declare -A W T
  for where in host rack; do
    run "$where" "$lammps_ranks" "$name-$where.log" lmp -in "in.$name" -log none || return 0
    T[$where]=$(sed -n 's/^Loop time of \([0-9.e+-]*\) .*/\1/p' "$name-$where.log" | tail -1)
    if [ -z "${T[$where]}" ]; then
      echo "FAILED: $where LAMMPS $name printed no \"Loop time\"" >&2; tail -5 "$name-$where.log" >&2; failed=1; return 0
    fi
    W[$where]=$wall
    thermo "$name-$where.log" >"$name-$where.thermo"
    record "lammps_${name}_loop_s_$where" "${T[$where]}"
    record "lammps_${name}_wall_s_$where" "${W[$where]}"
  done
  record "lammps_${name}_loop_s_rack/host" "$(ratio "${T[rack]}" "${T[host]}")"
  record "lammps_${name}_wall_s_rack/host" "$(ratio "${W[rack]}" "${W[host]}")"
  if cmp -s "$name-host.thermo" "$name-rack.thermo"; then same=same; else same=different; fi
  printf 'round %s LAMMPS %s: loop host %s s, rack %s s (x%s); wall host %s s, rack %s s (x%s); last thermo output %s\n' \
    "$round" "$name" "${T[host]}" "${T[rack]}" "$(ratio "${T[rack]}" "${T[host]}")" \
    "${W[host]}" "${W[rack]}" "$(ratio "${W[rack]}" "${W[host]}")" "$same"
  if [ "$same" = same ]; then
    sed 's/^/  | /' "$name-rack.thermo"
  else
    diff "$name-host.thermo" "$name-rack.thermo" | sed 's/^/  | /' || true
  fi
}

echo "bench-apps: the rack's runs over $fabric; LAMMPS on $lammps_ranks ranks"
for round in $(seq "$rounds"); do
  netpipe "$round"
  hpcc_run "$round"
  lammps "$round" melt
  lammps "$round" peptide
done

echo
printf '%-40s %10s %10s %10s %12s\n' "over $rounds rounds" min median max "median r/h"
for fig in $(awk '{ print $1 }' "$results" | sed 's/_\(host\|rack\|rack\/host\|rack\/ni\)$//' | awk '!seen[$0]++'); do
  for where in host rack; do
    awk -v f="${fig}_$where" '$1 == f { print $2 }' "$results" | sort -g |
      awk -v f="${fig}_$where" '{ v[NR] = $1 } END { if (NR) printf "%-40s %10s %10s %10s\n", f, v[1], v[int((NR + 1) / 2)], v[NR] }'
  done
  awk -v f="${fig}_rack/host" '$1 == f { print $2 }' "$results" | sort -g |
    awk -v f="$fig rack/host" '{ v[NR] = $1 } END { if (NR) printf "%-40s %10s %10s %10s %12s\n", f, v[1], v[int((NR + 1) / 2)], v[NR], v[int((NR + 1) / 2)] }'
  awk -v f="${fig}_rack/ni" '$1 == f { print $2 }' "$results" | sort -g |
    awk -v f="$fig rack/exanet-perf" '{ v[NR] = $1 } END { if (NR) printf "%-40s %10s %10s %10s\n", f, v[1], v[int((NR + 1) / 2)], v[NR] }'
done
if [ "$failed" != 0 ]; then
  echo "bench-apps: some runs failed (above)" >&2
  exit 1
fi
