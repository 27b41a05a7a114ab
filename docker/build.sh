#!/usr/bin/env bash
# Builds the exanet image (exanetd, exactl, exanet-ip, exanet-perf, the exanet examples, iperf3) without
# pulling anything from a registry.
#
#   docker/build.sh [TAG]        default tag exanet:latest
#
# EXANET_BASE=IMAGE builds on a base image you already have (debian:bookworm-slim, say);
# without it the base is made here from the host's glibc runtime (docker/mkbase.sh), so
# the build works on a machine with no registry. The binaries are built on the host with
# cargo (release profile), stripped, and staged with the Dockerfile in
# $CARGO_TARGET_DIR/docker-context, an ordinary build context.
set -euo pipefail
cd "$(dirname "$0")/.."
tag=${1:-exanet:latest}
target=${CARGO_TARGET_DIR:-target}
ctx=$target/docker-context

cargo build --release -q -p exanetd -p exactl -p exanet-perf -p exanet-ip
# The examples, and libexanet.a for the C one.
cargo build --release -q -p exanet --lib --examples

rm -rf "$ctx"
mkdir -p "$ctx/bin"
for b in exanetd exactl exanet-perf exanet-ip; do
  strip -o "$ctx/bin/$b" "$target/release/$b"
done
strip -o "$ctx/bin/exanet-pingpong" "$target/release/examples/pingpong"
strip -o "$ctx/bin/exanet-self-rtt" "$target/release/examples/self_rtt"
"${CC:-gcc}" -std=c11 -D_POSIX_C_SOURCE=200809L -O2 -Wall -Wextra -Werror \
  -I exanet/include exanet/examples/pingpong.c "$target/release/libexanet.a" \
  -lpthread -ldl -lm -lrt -lutil -lgcc_s -o "$ctx/bin/exanet-pingpong-c"
strip "$ctx/bin/exanet-pingpong-c"

# A static busybox: the host's if it has one, else Debian's busybox-static package (a
# Debian mirror is not a container registry), cached in the target directory.
busybox=""
if [ -x /bin/busybox ] && ! ldd /bin/busybox >/dev/null 2>&1; then
  busybox=/bin/busybox
else
  cache=$target/docker-cache
  busybox=$cache/busybox
  if [ ! -x "$busybox" ]; then
    mkdir -p "$cache/deb"
    (cd "$cache/deb" && apt-get download -q busybox-static >/dev/null 2>&1) || {
      echo "docker/build.sh: cannot fetch Debian's busybox-static (apt-get download busybox-static)" >&2
      exit 1
    }
    dpkg-deb -x "$cache"/deb/busybox-static_*.deb "$cache/deb/x"
    cp "$cache/deb/x/bin/busybox" "$busybox"
  fi
fi
cp "$busybox" "$ctx/bin/busybox"
# iperf3 (an unmodified program for IP over ExaNet between containers) from the host's
# Debian package, with its libraries (mkbase.sh copies what it loads). busybox brings ping.
extra=()
if command -v iperf3 >/dev/null 2>&1; then
  cp "$(command -v iperf3)" "$ctx/bin/iperf3"
  extra+=("$ctx/bin/iperf3")
else
  echo "docker/build.sh: no iperf3 on this host (apt-get install iperf3): the image has none" >&2
fi
cp docker/Dockerfile "$ctx/Dockerfile"

base=${EXANET_BASE:-}
if [ -z "$base" ]; then
  base=exanet-base:bookworm
  docker/mkbase.sh "$base" "$ctx"/bin/exanet* "$ctx/bin/exactl" "${extra[@]}"
fi
old=$(docker image inspect -f '{{.Id}}' "$tag" 2>/dev/null || true)
# The classic builder needs no registry for a base that is already local.
DOCKER_BUILDKIT=0 docker build -q --build-arg BASE="$base" -t "$tag" "$ctx" >/dev/null
# The image this build replaced, if nothing uses it any more (no pile of <none> images).
new=$(docker image inspect -f '{{.Id}}' "$tag")
if [ -n "$old" ] && [ "$old" != "$new" ]; then
  docker rmi "$old" >/dev/null 2>&1 || true
fi
size=$(docker image inspect -f '{{.Size}}' "$tag")
awk -v t="$tag" -v s="$size" -v b="$base" \
  'BEGIN { printf "docker/build.sh: built %s on %s: %.1f MB\n", t, b, s / 1e6 }'
