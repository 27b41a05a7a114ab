#!/usr/bin/env bash
# Makes a minimal base image without any registry: the glibc runtime files that the given
# binaries load (from this host, Debian bookworm), a /bin/sh that the Dockerfile's busybox
# provides, and the few /etc files programs expect. Imported with `docker import`.
#
#   docker/mkbase.sh TAG BINARY...
set -euo pipefail
tag=$1
shift
root=$(mktemp -d /tmp/exanet-base.XXXXXX)
trap 'rm -rf "$root"' EXIT

# Every shared object the binaries load, and the dynamic loader, at the paths ldd names.
for f in $(ldd "$@" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } NF == 2 && $1 ~ /^\// { print $1 }' | sort -u); do
  mkdir -p "$root$(dirname "$f")"
  cp -L "$f" "$root$f"
done
mkdir -p "$root"/{bin,etc,tmp,rack,usr/local/bin}
chmod 1777 "$root/tmp"
# The Dockerfile copies busybox to /usr/local/bin; /bin/sh resolves once it is there.
ln -s /usr/local/bin/busybox "$root/bin/sh"
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n' >"$root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
# glibc >= 2.34 has files and dns built in; this makes the lookup order explicit.
printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$root/etc/nsswitch.conf"
old=$(docker image inspect -f '{{.Id}}' "$tag" 2>/dev/null || true)
tar -C "$root" --numeric-owner --owner=0 --group=0 -c . |
  docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    -m "exanet offline base: host glibc runtime of $(basename -a "$@" | tr '\n' ' ')" \
    - "$tag" >/dev/null
new=$(docker image inspect -f '{{.Id}}' "$tag")
if [ -n "$old" ] && [ "$old" != "$new" ]; then
  docker rmi "$old" >/dev/null 2>&1 || true # still used by an image built on it: kept
fi
echo "docker/mkbase.sh: imported $tag ($(du -sh "$root" | cut -f1) of files)"
