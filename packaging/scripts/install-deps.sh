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
# docker.io's postinst would start the system's dockerd (iptables rules, a bridge, /var/lib/docker):
# the Docker tier starts a private one, so a policy-rc.d refuses docker's units for this run only
# (deb-systemd-invoke and invoke-rc.d both ask it); a machine's own policy-rc.d is left alone
if [[ " ${missing[*]} " == *" docker.io "* && ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\ncase "$1" in docker|docker.service|docker.socket) exit 101;; esac\nexit 0\n' \
        >/usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
# wait for another apt/dpkg run (another checkout's make) instead of failing on its lock
apt-get -o DPkg::Lock::Timeout=600 update -qq
apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${missing[@]}" >/dev/null
