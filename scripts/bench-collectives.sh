#!/usr/bin/env bash
# Collectives in modeled time against the report's figures (section 6.1.3 and 6.1.5),
# with wall-clock figures of the same runs for the record. Local racks of release daemons
# with the MPI software cost the fidelity benchmark calibrates on the intra-FPGA row
# ([model] software_ns, default 418 ns per call): 4x1x1 (16 ranks) and 4x4x2 (128 ranks).
# Needs: cargo build --release -p exanetd -p exactl -p exanet-perf
# Software rows run twice: as ExaNet-MPI sends (steps past 32 B by rendezvous over RDMA, the
# library's default) and with every step eager (--eager 65535: packetizer messages only).
# ORDER=modeled serves contended cells in modeled order ([model] order, docs/modeled-time.md):
# every modeled figure then repeats from run to run; host order (the default) is faster.
# Usage: [SOFTWARE_NS=418] [ITER=50] [ORDER=host|modeled] scripts/bench-collectives.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$PWD/target/release
sw=${SOFTWARE_NS:-418}
iter=${ITER:-50}
order=${ORDER:-host}
case $order in host | modeled) ;; *)
  echo "ORDER must be host or modeled, not $order" >&2
  exit 2
  ;;
esac
export EXANET_DAEMON=$bin/exanetd
racks=()
cleanup() {
  for r in "${racks[@]}"; do
    EXANET_RACK=$r "$bin/exactl" rack down >/dev/null 2>&1 || true
    rm -rf "$r"
  done
}
trap cleanup EXIT
# Called as r=$(up SHAPE), a subshell: the caller adds the rack to `racks` for cleanup.
up() {
  local r
  r=$(mktemp -d /tmp/exanet-bench-coll.XXXX)
  EXANET_RACK=$r "$bin/exactl" rack up --shape "$1" --ip off >/dev/null 2>&1
  EXANET_RACK=$r "$bin/exactl" rack down >/dev/null 2>&1
  printf '\n[model]\nsoftware_ns = %s\norder = "%s"\n' "$sw" "$order" >>"$r/rack.toml"
  EXANET_RACK=$r "$bin/exactl" rack up --ip off >/dev/null 2>&1
  echo "$r"
}
# what, report us, rack, exanet-perf arguments
row() {
  local what=$1 report=$2 rack=$3
  shift 3
  local err
  err=$(mktemp)
  # A failed run (a timeout, a wrong result) says why and ends the script, as before.
  if ! EXANET_RACK=$rack "$bin/exanet-perf" "$@" --iterations "$iter" --warmup 5 --json \
    2>"$err" >"$err.out"; then
    echo "$what: exanet-perf failed:" >&2
    tail -5 "$err" >&2
    rm -f "$err" "$err.out"
    return 1
  fi
  rm -f "$err"
  python3 -c '
import json, sys
what, report = sys.argv[1], float(sys.argv[2])
for line in sys.stdin:
    d = json.loads(line)
    m, lo, hi = d["modeled_p50_us"], d["modeled_min_us"], d["modeled_max_us"]
    wall, ops = d["p50_us"], d["accelerator_ops"]
    print(f"{what:<44} {report:>9.2f} {m:>9.2f} {100*(m-report)/report:>+8.1f}%  "
          f"modeled min/max {lo:.2f}/{hi:.2f}  wall p50 {wall:.0f} us  accel ops {ops}")
' "$what" "$report" <"$err.out"
  rm -f "$err.out"
}
echo "software cost per call: $sw ns; $order order; $iter iterations; modeled p50 in us"
printf '%-44s %9s %9s %9s\n' what report modeled error
r16=$(up 4x1x1)
racks+=("$r16")
row "allreduce 256 B, 16 ranks, accelerator" 6.79 "$r16" allreduce --qfdbs 4 --sizes 256 --accel on
row "allreduce 256 B, 16 ranks, software" 39.7 "$r16" allreduce --qfdbs 4 --sizes 256 --accel off
row "  the same, every step eager" 39.7 "$r16" allreduce --qfdbs 4 --sizes 256 --accel off --eager 65535
row "allreduce 512 B, 16 ranks, accelerator" 13.38 "$r16" allreduce --qfdbs 4 --sizes 512 --accel on
row "allreduce 1024 B, 16 ranks, accelerator" 26.11 "$r16" allreduce --qfdbs 4 --sizes 1K --accel on
row "bcast 1 B, 4 ranks" 1.93 "$r16" bcast --qfdbs 1 --sizes 1 --type i32
row "allreduce 8 B, 4 ranks of one QFDB (software)" 5.34 "$r16" allreduce --qfdbs 1 --sizes 8 --accel off
row "allreduce 64 B, 4 ranks of one QFDB (software)" 33.62 "$r16" allreduce --qfdbs 1 --sizes 64 --accel off
row "  the same, every step eager" 33.62 "$r16" allreduce --qfdbs 1 --sizes 64 --accel off --eager 65535
EXANET_RACK=$r16 "$bin/exactl" rack down >/dev/null 2>&1
r128=$(up 4x4x2)
racks+=("$r128")
row "allreduce 256 B, 128 ranks, accelerator" 9.61 "$r128" allreduce --qfdbs 32 --sizes 256 --accel on
row "allreduce 256 B, 128 ranks, software" 76.9 "$r128" allreduce --qfdbs 32 --sizes 256 --accel off
row "  the same, every step eager" 76.9 "$r128" allreduce --qfdbs 32 --sizes 256 --accel off --eager 65535
