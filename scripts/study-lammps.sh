#!/usr/bin/env bash
# The report's application study (section 6.2, Figure 20, Table 3) on the rack: LAMMPS
# weak and strong scaling under `exactl mpirun --modeled`, four ranks per MPSoC as the
# report ran them, loop times in modeled seconds (LAMMPS times itself with MPI_Wtime,
# which answers each rank's modeled clock). Prints one line per run, then per rank count
# the median loop time and the efficiency beside Table 3's and Figure 20's, and writes
# the table (study.tsv) and a plot (study.svg, open it in a browser) to OUT.
#
#   scripts/study-lammps.sh [OUT] [RANKS] [RUNS]
#     OUT    where the results go (default ./study-lammps)
#     RANKS  rank counts (default "1 2 4 8 16 32": up to four per node of a 2x1x1 rack)
#     RUNS   runs per point (default 2; the report averaged 15, here they repeat)
#
# It brings up its own 2x1x1 rack with IP (as root: Open MPI's runtime rides IP over
# ExaNet) in a scratch directory, from the release build beside this script
# (cargo build --release -p exactl -p exanetd -p exanet-ip -p exanet-fi), and takes it
# down at the end. Needs Debian's lammps and openmpi-bin, and python3 for the plot.
#
# The input: Debian has no rhodopsin (the report's), so `melt` (Lennard-Jones, Debian's
# examples/melt) stands in, with the report's sizes: 32,000 atoms per rank for weak
# scaling (a box of 20x20x20 fcc cells per rank, stacked along x, y, z), 32,000 atoms in
# all for strong scaling, 100 steps each. Melt's compute per atom is far lighter than
# rhodopsin's (no long-range PPPM), so communication weighs more here than there.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=$(mkdir -p "${1:-study-lammps}" && cd "${1:-study-lammps}" && pwd)
ranks=${2:-"1 2 4 8 16 32"}
runs=${3:-2}
steps=${STUDY_STEPS:-100}
bin=$here/target/release
for b in exactl exanetd exanet-ip libexanet_fi.so; do
  [ -e "$bin/$b" ] || { echo "study-lammps: $bin/$b is not built (cargo build --release -p exactl -p exanetd -p exanet-ip -p exanet-fi)" >&2; exit 2; }
done
command -v lmp >/dev/null || { echo "study-lammps: no lmp (Debian: apt-get install lammps)" >&2; exit 2; }
command -v python3 >/dev/null || { echo "study-lammps: no python3 (for the plot)" >&2; exit 2; }

rack=$(mktemp -d /tmp/exanet-study.XXXXXX)
cleanup() {
  "$bin/exactl" --rack "$rack/rack" rack down >/dev/null 2>&1 || true
  rm -rf "$rack"
}
trap cleanup EXIT
"$bin/exactl" --rack "$rack/rack" rack up --shape 2x1x1 --ip on >"$rack/up.log" 2>&1 || { cat "$rack/up.log" >&2; exit 1; }

cat > "$rack/in.study" <<'EOF'
# Lennard-Jones melt (Debian's examples/melt), its box scaled by nx, ny, nz.
units		lj
atom_style	atomic
lattice		fcc 0.8442
region		box block 0 $(20*v_nx) 0 $(20*v_ny) 0 $(20*v_nz)
create_box	1 box
create_atoms	1 box
mass		1 1.0
velocity	all create 3.0 87287 loop geom
pair_style	lj/cut 2.5
pair_coeff	1 1 1.0 1.0 2.5
neighbor	0.3 bin
neigh_modify	every 20 delay 0 check no
fix		1 all nve
thermo		${steps}
run		${steps}
EOF

# The box of `n` ranks' worth of cells: doubling x, then y, then z, as evenly as a power
# of two allows (1 -> 1 1 1, 2 -> 2 1 1, 4 -> 2 2 1, 8 -> 2 2 2, 16 -> 4 2 2, 32 -> 4 4 2).
box() {
  local n=$1 x=1 y=1 z=1 k=0
  while [ $((x * y * z)) -lt "$n" ]; do
    case $((k % 3)) in 0) x=$((x * 2)) ;; 1) y=$((y * 2)) ;; 2) z=$((z * 2)) ;; esac
    k=$((k + 1))
  done
  echo "$x $y $z"
}

results=$out/study.tsv
printf 'mode\tranks\trun\tloop_s\n' > "$results"
for mode in weak strong; do
  for n in $ranks; do
    if [ "$mode" = weak ]; then read -r x y z <<<"$(box "$n")"; else x=1 y=1 z=1; fi
    for r in $(seq 1 "$runs"); do
      log=$rack/$mode-$n-$r.log
      (cd "$rack" && "$bin/exactl" --rack "$rack/rack" mpirun --modeled --ranks-per-node 4 \
        -np "$n" -- lmp -log none -in in.study -var nx "$x" -var ny "$y" -var nz "$z" \
        -var steps "$steps") > "$log" 2>&1 || { echo "study-lammps: $mode $n ranks failed:" >&2; tail -20 "$log" >&2; exit 1; }
      loop=$(awk '/^Loop time of/ {print $4}' "$log")
      [ -n "$loop" ] || { echo "study-lammps: no loop time in $log" >&2; tail -20 "$log" >&2; exit 1; }
      printf '%s\t%s\t%s\t%s\n' "$mode" "$n" "$r" "$loop" >> "$results"
      echo "$mode $n ranks run $r: loop $loop s (modeled)"
    done
  done
done

python3 - "$results" "$out/study.svg" <<'EOF'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])][1:]
# The report's efficiencies (Table 3 at 2 and 512, the text of section 6.2 at 4).
report = {"weak": {2: 0.96, 4: 0.89, 512: 0.69}, "strong": {2: 0.97, 512: 0.82}}
eff = {}
print("\nmode    ranks  loop s (median)  efficiency  report")
for mode in ("weak", "strong"):
    loops = {}
    for m, n, _, t in rows:
        if m == mode:
            loops.setdefault(int(n), []).append(float(t))
    med = {n: statistics.median(v) for n, v in sorted(loops.items())}
    t1 = med.get(1)
    for n, t in med.items():
        e = (t1 / t if mode == "weak" else t1 / (n * t)) if t1 else float("nan")
        eff.setdefault(mode, []).append((n, e))
        rep = report[mode].get(n)
        spread = max(loops[n]) / min(loops[n]) - 1
        print(f"{mode:7} {n:5}  {t:14.4f}  {e:9.1%}  {'' if rep is None else f'{rep:.0%}':>6}"
              f"   (runs differ by {spread:.2%})")
# A plot a person opens: efficiency against ranks (log2), the rack's and the report's.
W, H, L, B = 640, 400, 60, 50
xs = [n for m in eff.values() for n, _ in m] + [512]
import math
xmax = math.log2(max(xs))
def px(n): return L + (W - L - 20) * (math.log2(n) / xmax if xmax else 0)
def py(e): return H - B - (H - B - 20) * max(0.0, min(1.1, e)) / 1.1
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
       f'<rect width="{W}" height="{H}" fill="white"/>',
       f'<line x1="{L}" y1="{H-B}" x2="{W-20}" y2="{H-B}" stroke="black"/>',
       f'<line x1="{L}" y1="20" x2="{L}" y2="{H-B}" stroke="black"/>',
       f'<text x="{W/2}" y="{H-15}" text-anchor="middle">MPI ranks (4 per MPSoC)</text>',
       f'<text x="15" y="{H/2}" transform="rotate(-90 15 {H/2})" text-anchor="middle">parallel efficiency</text>']
for e in (0.0, 0.25, 0.5, 0.75, 1.0):
    svg.append(f'<text x="{L-8}" y="{py(e)+4}" text-anchor="end">{e:.0%}</text>')
    svg.append(f'<line x1="{L}" y1="{py(e)}" x2="{W-20}" y2="{py(e)}" stroke="#ddd"/>')
for n in sorted(set(xs)):
    svg.append(f'<text x="{px(n)}" y="{H-B+16}" text-anchor="middle">{n}</text>')
colors = {"weak": "#1f77b4", "strong": "#d62728"}
for mode, pts in eff.items():
    c = colors[mode]
    path = " ".join(f"{px(n):.1f},{py(e):.1f}" for n, e in pts)
    svg.append(f'<polyline points="{path}" fill="none" stroke="{c}" stroke-width="2"/>')
    for n, e in pts:
        svg.append(f'<circle cx="{px(n):.1f}" cy="{py(e):.1f}" r="3" fill="{c}"/>')
    for n, e in report[mode].items():
        svg.append(f'<rect x="{px(n)-4:.1f}" y="{py(e)-4:.1f}" width="8" height="8" fill="none" stroke="{c}"/>')
svg.append(f'<text x="{L+10}" y="{H-B-30}" fill="{colors["weak"]}">weak scaling (dots: rack, squares: report)</text>')
svg.append(f'<text x="{L+10}" y="{H-B-13}" fill="{colors["strong"]}">strong scaling</text>')
svg.append("</svg>")
open(sys.argv[2], "w").write("\n".join(svg) + "\n")
print(f"\nplot: {sys.argv[2]}")
EOF
echo "table: $results"
