#!/usr/bin/env bash
# Build numa-pin_<version>_all.deb from this checkout with dpkg-deb (no debhelper, no venv).
#
#   packaging/scripts/build-deb.sh [OUTPUT_DIR]     (default: the checkout's top directory)
#
# The Python package is built as a wheel by Debian's own python3 and setuptools (the check
# that pyproject.toml builds with setuptools 66) and unpacked into
# /usr/lib/python3/dist-packages; the commands are small /usr/bin/python3 scripts; paths in
# the shipped hook files and units are rewritten from /usr/local/bin to /usr/bin.
# Needs: dpkg-deb, /usr/bin/python3 with python3-setuptools and python3-wheel.
set -euo pipefail

top="$(cd "$(dirname "$0")/../.." && pwd)"
out="$(realpath -m "${1:-$top}")"
py=/usr/bin/python3
version="$("$py" -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' \
    "$top/pyproject.toml")"
deb="$out/numa-pin_${version}_all.deb"

work="$(mktemp -d "${TMPDIR:-/tmp}/numa-pin-deb.XXXXXX")"
trap 'rm -rf "$work"' EXIT
src="$work/src" root="$work/root" wheels="$work/wheels"
mkdir -p "$src" "$root/DEBIAN" "$wheels"

# a reproducible archive: file times come from the last commit when there is one
if [ -z "${SOURCE_DATE_EPOCH:-}" ] && git -C "$top" rev-parse --git-dir >/dev/null 2>&1; then
    SOURCE_DATE_EPOCH="$(git -C "$top" log -1 --format=%ct)"
fi
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(date +%s)}"

# 1. the wheel, built from a copy so the checkout gets no build/ or egg-info
cp -r "$top/pyproject.toml" "$top/README.md" "$top/src" "$src/"
find "$src" -name __pycache__ -prune -exec rm -rf {} +
(cd "$src" && "$py" -c 'import sys; from setuptools import build_meta as b; print(b.build_wheel(sys.argv[1]))' \
    "$wheels" >"$work/wheel.log" 2>&1) || { cat "$work/wheel.log" >&2; exit 1; }
wheel="$(ls "$wheels"/numa_pin-"$version"-*.whl)"

# 2. the modules and their dist-info, where Debian's python3 finds them
site="$root/usr/lib/python3/dist-packages"
mkdir -p "$site"
"$py" -m zipfile -e "$wheel" "$site"
echo "debian" >"$site/numa_pin-$version.dist-info/INSTALLER"

# 3. the commands, on Debian's interpreter (what the wheel's entry points say)
mkdir -p "$root/usr/bin"
script() {  # NAME MODULE FUNCTION
    printf '#!/usr/bin/python3\nimport sys\n\nfrom %s import %s\n\nsys.exit(%s())\n' "$2" "$3" "$3" \
        >"$root/usr/bin/$1"
    chmod 755 "$root/usr/bin/$1"
}
script numa-pin numa_pin.cli.main main
# the hook starts on every container start: without the site module, its directories listed
for cmd in numa-pin-hook numa-pin-runc; do  # numa-pin-runc: Docker's runtime, started on every runc call
    "$py" "$top/packaging/scripts/write-hook-launcher.py" /usr/bin/python3 "$root/usr/bin/$cmd" \
        /usr/lib/python3/dist-packages
done

# 4. hook files, snippets, units and the sample config, pointing at /usr/bin
install_file() {  # MODE SOURCE DEST
    install -D -m "$1" "$2" "$root$3"
    sed -i 's#/usr/local/bin/numa-pin#/usr/bin/numa-pin#g' "$root$3"
}
pk="$top/packaging"
hooksd=/usr/share/containers/oci/hooks.d
share=/usr/share/numa-pin
# the stages CRI-O and podman both accept go where both read (CRI-O refuses to start on a file
# in its hooks dirs naming any other stage); podman's precreate goes to a directory only podman
# reads, added to podman's hooks_dir by a containers.conf.d drop-in (CRI-O reads crio.conf)
for hook in numa-pin.json numa-pin-release.json; do
    install_file 644 "$pk/hooks.d/$hook" "$hooksd/$hook"
    install_file 644 "$pk/hooks.d/$hook" "$share/hooks.d/$hook"
done
install_file 644 "$pk/podman/hooks.d/numa-pin-precreate.json" "$share/podman/hooks.d/numa-pin-precreate.json"
install_file 644 "$pk/podman/containers.conf.d/numa-pin.conf" /etc/containers/containers.conf.d/numa-pin.conf
install_file 644 "$pk/runc/hooks-snippet.json" "$share/runc/hooks-snippet.json"
install_file 644 "$pk/containerd/hooks.json" "$share/containerd/hooks.json"
install_file 644 "$pk/containerd/config.toml" "$share/containerd/config.toml"
install_file 755 "$pk/containerd/numa-pin-containerd-spec" "$share/containerd/numa-pin-containerd-spec"
ln -s ../share/numa-pin/containerd/numa-pin-containerd-spec "$root/usr/bin/numa-pin-containerd-spec"
install_file 644 "$pk/config.yaml" /etc/numa-pin/config.yaml
for unit in numa-pin-agent.socket numa-pin-agent.service numa-pin-reconcile.service numa-pin-reconcile.timer \
    numa-pin-nrt.service numa-pin-nri.service; do
    install_file 644 "$pk/systemd/$unit" "/lib/systemd/system/$unit"
done
install -D -m 644 "$pk/deb/copyright" "$root/usr/share/doc/numa-pin/copyright"
install -D -m 644 "$top/README.md" "$root/usr/share/doc/numa-pin/README.md"
# the user docs and design notes the README links to, at the same relative paths
(cd "$top" && find docs -type f -name '*.md') | while read -r doc; do
    install -D -m 644 "$top/$doc" "$root/usr/share/doc/numa-pin/$doc"
done

# 5. control files
# the maintainer scripts know their version (prerm folds the ledger's journal before a downgrade)
for f in postinst prerm postrm; do
    sed "s/@VERSION@/$version/g" "$pk/deb/$f" >"$root/DEBIAN/$f"
    chmod 755 "$root/DEBIAN/$f"
done
printf '%s\n' /etc/numa-pin/config.yaml /etc/containers/containers.conf.d/numa-pin.conf >"$root/DEBIAN/conffiles"
size="$(du -sk --exclude=DEBIAN "$root" | cut -f1)"
sed -e "s/@VERSION@/$version/" -e "s/@INSTALLED_SIZE@/$size/" "$pk/deb/control.in" >"$root/DEBIAN/control"
(cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) \
    >"$root/DEBIAN/md5sums"

find "$root" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
mkdir -p "$out"
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "$deb"
