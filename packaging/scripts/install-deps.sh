#!/usr/bin/env bash
# Install the Debian packages numa-pin's build, tests and demo need, once.
# Skips quietly what is already installed; needs root only when something is missing.
set -euo pipefail
missing=()
for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
    echo "numa-pin: missing Debian packages (run as root to install): ${missing[*]}" >&2
    exit 1
fi
echo "numa-pin: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# wait for another apt/dpkg run (another checkout's make) instead of failing on its lock
apt-get -o DPkg::Lock::Timeout=600 update -qq
apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${missing[@]}" >/dev/null
