#!/usr/bin/env bash
# Build the container image of numa-pin's NRI plugin from Debian 12's packages and numa-pin's deb.
#
#   packaging/image/build-image.sh [--archive FILE]
#
# 1. a minimal Debian 12 root (debootstrap --variant=minbase) from the archive this machine's apt
#    uses, with numa-pin's Debian dependencies (the Depends of packaging/deb/control.in) and
#    systemd (systemctl: the plugin tells the host's systemd about the cpusets it writes), cached
#    under $NUMA_PIN_IMAGE_CACHE (default .cache/image-root) by a hash of what it is made of;
#    debs this machine's apt already holds are reused;
# 2. a copy of it with the deb of this checkout (packaging/scripts/build-deb.sh) installed by
#    dpkg, apt's lists and caches, docs and man pages removed;
# 3. buildah: one layer from scratch, entry point `numa-pin serve --nri`, committed as
#    $NUMA_PIN_IMAGE (default localhost/numa-pin:<version>); with --archive also saved as a
#    docker-archive FILE (`ctr -n k8s.io images import FILE`, `podman load -i FILE`).
#
# No registry is used. Needs root (debootstrap, chroot), debootstrap and buildah.
set -euo pipefail

top="$(cd "$(dirname "$0")/../.." && pwd)"
archive=""
if [ "${1:-}" = --archive ]; then
    archive="$(realpath -m "${2:?--archive FILE}")"
elif [ -n "${1:-}" ]; then
    echo "usage: $0 [--archive FILE]" >&2
    exit 2
fi
[ "$(id -u)" -eq 0 ] || { echo "numa-pin: building the image needs root (debootstrap, chroot)" >&2; exit 1; }
for tool in debootstrap buildah dpkg-deb; do
    command -v "$tool" >/dev/null || { echo "numa-pin: $tool is not installed (make deps installs it)" >&2; exit 1; }
done

version="$(/usr/bin/python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' \
    "$top/pyproject.toml")"
image="${NUMA_PIN_IMAGE:-localhost/numa-pin:$version}"
suite=bookworm
cache="$(realpath -m "${NUMA_PIN_IMAGE_CACHE:-$top/.cache/image-root}")"

# the archive this machine's apt uses: the first deb URI that is not the security archive
mirror="$(cat /etc/apt/sources.list /etc/apt/sources.list.d/* 2>/dev/null \
    | awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /:\/\//) { print $i; break } }
           $1 == "URIs:" { print $2 }' | grep -v security | head -n1 || true)"
mirror="${mirror:-http://deb.debian.org/debian}"
mirror="${mirror%/}"

# the deb's Depends, without versions and alternatives' second choices
depends="$(sed -n 's/^Depends: //p' "$top/packaging/deb/control.in" \
    | tr ',' '\n' | sed -e 's/|.*//' -e 's/(.*)//' -e 's/[[:space:]]//g' | grep -v '^$' | sort -u | paste -sd,)"
packages="$depends,systemd"
recipe="version=1 suite=$suite mirror=$mirror packages=$packages"
base="$cache/base-$(printf '%s' "$recipe" | sha256sum | cut -c1-16)"

if [ ! -f "$base/.complete" ]; then
    mkdir -p "$cache/debs"
    # debs this machine already downloaded, hard-linked (debootstrap checks each against the archive)
    find /var/cache/apt/archives -maxdepth 1 -name '*.deb' -exec cp -nl {} "$cache/debs/" \; 2>/dev/null || true
    work="$(mktemp -d "$cache/base.XXXXXX")"
    trap 'rm -rf "$work"' EXIT
    echo "numa-pin: debootstrap $suite from $mirror with $packages" >&2
    debootstrap --variant=minbase --cache-dir="$cache/debs" --include="$packages" \
        "$suite" "$work/root" "$mirror" >"$work/debootstrap.log" 2>&1 \
        || { tail -n 30 "$work/debootstrap.log" >&2; exit 1; }
    printf '%s\n' "$recipe" >"$work/recipe"
    touch "$work/.complete"
    rm -rf "$base"
    mv "$work" "$base"
    trap - EXIT
    for old in "$cache"/base-*; do
        [ "$old" = "$base" ] || rm -rf "$old"
    done
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/numa-pin-image.XXXXXX")"
ctr=""
cleanup() {
    [ -z "$ctr" ] || buildah rm "$ctr" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

deb="$(bash "$top/packaging/scripts/build-deb.sh" "$work")"
root="$work/root"
cp -a "$base/root" "$root"
cp "$deb" "$root/tmp/numa-pin.deb"
chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
    dpkg -i /tmp/numa-pin.deb >"$work/dpkg.log" 2>&1 || { cat "$work/dpkg.log" >&2; exit 1; }
rm -f "$root/tmp/numa-pin.deb"
chroot "$root" numa-pin --version >/dev/null
# what a container never reads
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
    "$root"/var/cache/debconf/*-old "$root"/var/log/*.log "$root"/var/log/apt/* \
    "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/*
mkdir -p "$root/usr/share/doc/numa-pin"
cp "$top/packaging/deb/copyright" "$root/usr/share/doc/numa-pin/copyright"
: >"$root/etc/machine-id"

# one layer, from a tar with sorted names and one time: the same tree gives the same layer
if [ -z "${SOURCE_DATE_EPOCH:-}" ] && git -C "$top" rev-parse --git-dir >/dev/null 2>&1; then
    SOURCE_DATE_EPOCH="$(git -C "$top" log -1 --format=%ct)"
fi
stamp="${SOURCE_DATE_EPOCH:-$(date +%s)}"
tar -C "$root" --sort=name --numeric-owner --mtime="@$stamp" --clamp-mtime -cf "$work/root.tar" .

ctr="$(buildah from scratch)"
buildah add "$ctr" "$work/root.tar" / >/dev/null
buildah config --entrypoint '["numa-pin", "serve", "--nri"]' --cmd '' \
    --env PATH=/usr/sbin:/usr/bin:/sbin:/bin --env NUMA_PIN_CONFIG=/etc/numa-pin/config.yaml \
    --label org.opencontainers.image.title=numa-pin \
    --label org.opencontainers.image.version="$version" \
    --label org.opencontainers.image.description="numa-pin's NRI plugin (docs/kubernetes-deploy.md)" \
    "$ctr"
buildah commit --quiet --rm "$ctr" "$image" >/dev/null
ctr=""
if [ -n "$archive" ]; then
    rm -f "$archive"
    buildah push --quiet "$image" "docker-archive:$archive:$image" >/dev/null
    echo "$archive"
fi
echo "$image"
