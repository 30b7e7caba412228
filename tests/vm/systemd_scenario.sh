# The systemd guest's scenario (bash, run as root by numa-pin-scenario.service at every boot).
# Every step leaves <name>.out (stdout and stderr) and <name>.rc in $NP_OUT/b<boot>/; the test
# (tests/vm/test_vm_systemd.py) reads them. Boot 1 proves the runtimes, the systemd properties,
# daemon-reload, another writer of AllowedCPUs and `numa-pin run`, then kills an isolated
# container with -9 and cuts the power with live grants; boot 2 proves they are gone, that an
# isolated grant of this boot gives back exactly what this boot had, the socket-activated agent,
# and `apt purge`.
set -u
O="$NP_OUT/b$NP_BOOT"
mkdir -p "$O"
rec() {  # NAME COMMAND...: run it, keep its output and status
    n=$1; shift
    "$@" > "$O/$n.out" 2>&1
    echo $? > "$O/$n.rc"
}
R=/var/lib/machines/busybox
SHOW='grep -E "^(Cpus|Mems)_allowed_list" /proc/self/status; cat /proc/self/cgroup'
# the cpuset of a unit: its AllowedCPUs property, the cgroup's effective CPUs
unit_state() {
    cg=$(systemctl show -P ControlGroup "$1")
    echo "AllowedCPUs=$(systemctl show -P AllowedCPUs "$1")"
    echo "AllowedMemoryNodes=$(systemctl show -P AllowedMemoryNodes "$1")"
    echo "effective=$(cat "/sys/fs/cgroup$cg/cpuset.cpus.effective")"
    echo "cpus=$(cat "/sys/fs/cgroup$cg/cpuset.cpus")"
}
# what isolation changes on the host, as JSON: every IRQ's affinity, the default mask, each CPU's
# pm_qos resume latency, and the host cgroups' cpusets with their AllowedCPUs
host_state() {
    python3 - <<'PY'
import glob, json, subprocess
def read(path):
    try:
        return open(path).read().strip()
    except OSError:
        return None
def show(prop, unit):
    return subprocess.run(["systemctl", "show", "-P", prop, unit], capture_output=True, text=True).stdout.strip()
out = {"irqs": {p.split("/")[3]: read(p) for p in glob.glob("/proc/irq/*/smp_affinity_list")},
       "default_smp_affinity": read("/proc/irq/default_smp_affinity"),
       "pm_qos": {p.split("/")[5]: read(p)
                  for p in glob.glob("/sys/devices/system/cpu/cpu[0-9]*/power/pm_qos_resume_latency_us")}}
for unit in ("init.scope", "system.slice", "user.slice"):
    cg = show("ControlGroup", unit)
    out[unit] = {"AllowedCPUs": show("AllowedCPUs", unit), "cpus": read(f"/sys/fs/cgroup{cg}/cpuset.cpus"),
                 "effective": read(f"/sys/fs/cgroup{cg}/cpuset.cpus.effective")}
print(json.dumps(out, sort_keys=True))
PY
}
# a bundle asking every host-side isolation knob: isolated NAME
isolated() {
    bundle "$1" 1 sleep 100000
    python3 - "/run/bundles/$1/config.json" "$1" <<'PY'
import json, sys
path, name = sys.argv[1:]
spec = json.load(open(path))
spec["annotations"].update({"numa-pin.io/host-services": "disable", "cpu-c-states.crio.io": "disable",
                            "irq-load-balancing.crio.io": "disable"})
spec["linux"]["cgroupsPath"] = f"machine.slice:runc:{name}"
json.dump(spec, open(path, "w"))
PY
}
# a runc bundle with the shipped snippet and the systemd cgroup driver: bundle NAME CPUS ARGS...
bundle() {
    name=$1; b=/run/bundles/$1; cpus=$2; shift 2
    mkdir -p "$b"
    (cd "$b" && runc spec)
    python3 - "$b/config.json" /usr/share/numa-pin/runc/hooks-snippet.json "$name" "$cpus" "$@" <<'EOF'
import json, sys
path, snippet, name, cpus, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
spec = json.load(open(path))
spec["root"] = {"path": "/var/lib/machines/busybox", "readonly": True}
spec["process"]["terminal"] = False
spec["process"]["args"] = args
spec["linux"]["cgroupsPath"] = f"system.slice:runc:{name}"
if cpus != "0":
    spec["annotations"] = {"numa-pin.io/cpus": cpus}
spec["hooks"] = json.load(open(snippet))["hooks"]
json.dump(spec, open(path, "w"), indent=1)
EOF
}

# start a bundle detached: start_detached NAME ID; a second try when the first fails (under TCG on
# a loaded host a hook can run past the snippet's 30 s); the log says when it took two
start_detached() {
    for try in 1 2; do
        runc --systemd-cgroup run -d --bundle "/run/bundles/$1" "$2" < /dev/null >> "$O/$2.log" 2>&1 && return 0
        echo "numa-pin-scenario: try $try of $2 failed" >> "$O/$2.log"
        runc --systemd-cgroup delete -f "$2" >> "$O/$2.log" 2>&1
    done
    return 1
}

if [ "$NP_BOOT" = 1 ]; then
    cat /proc/1/comm > "$O/init"
    stat -f -c %T /sys/fs/cgroup > "$O/cgroupfs"
    cat /sys/devices/system/node/node*/cpulist > "$O/nodes"
    mkdir -p "$R/bin" "$R/proc" "$R/sys" "$R/dev" "$R/tmp" "$R/etc"
    cp /bin/busybox "$R/bin/"
    for a in sh sleep cat grep; do ln -sf busybox "$R/bin/$a"; done
    rec enable systemctl enable --now numa-pin-agent.socket

    # item 1: containers that ask numa-pin for nothing start; exclusive ones are pinned
    rec podman-crun podman run --rm --network none --rootfs "$R" sh -c "$SHOW"
    rec podman-runc podman --runtime runc run --rm --network none --rootfs "$R" sh -c "$SHOW"
    rec podman-crun-excl podman run --rm --network none --annotation numa-pin.io/cpus=1 --rootfs "$R" sh -c "$SHOW"
    rec podman-runc-excl podman --runtime runc run --rm --network none --annotation numa-pin.io/cpus=1 \
        --rootfs "$R" sh -c "$SHOW"
    bundle plain 0 sh -c "$SHOW"
    rec runc-plain runc --systemd-cgroup run --bundle /run/bundles/plain np-plain
    bundle excl1 1 sh -c "$SHOW"
    rec runc-excl runc --systemd-cgroup run --bundle /run/bundles/excl1 np-excl1

    # item 2: a running exclusive container and a running shared one, both in systemd scopes
    bundle shared 0 sleep 100000
    start_detached shared np-shared
    bundle excl 1 sleep 100000
    start_detached excl np-excl
    rec status-1 numa-pin status --json
    rec excl-granted unit_state runc-excl.scope
    rec shared-granted unit_state runc-shared.scope
    systemctl daemon-reload
    rec excl-reload unit_state runc-excl.scope
    rec shared-reload unit_state runc-shared.scope
    systemctl set-property runc-excl.scope AllowedCPUs=0-3   # another writer
    systemctl daemon-reload
    rec excl-other-writer unit_state runc-excl.scope
    rec reconcile numa-pin reconcile
    rec excl-reconciled unit_state runc-excl.scope
    systemctl daemon-reload
    rec excl-reconciled-reload unit_state runc-excl.scope

    # item 5: numa-pin run lives in a transient scope of its own
    rec run numa-pin run --cpus 1 -- sh -c "$SHOW"
    rec run-no-root-cgroup test ! -e /sys/fs/cgroup/numa-pin
    # issue 24, knob 1: host services off an exclusive CPU. A grant asking
    # numa-pin.io/host-services: disable (its scope in machine.slice), then four busy loops started
    # as host services (one per guest CPU, niced so the guest's own work goes first), their last CPU
    # (/proc/<pid>/stat field 39) sampled while the grant lives, after a daemon-reload, and after release
    loops() { for n in 1 2 3 4; do systemctl show -P MainPID "np-hostloop$n"; done; }
    sample_loops() {  # one line per sample: the CPU of each loop; then each loop's allowed CPUs
        # one python process for all samples: a fork per sample takes seconds under TCG with the loops busy
        python3 - $(loops) <<'PY'
import sys, time
pids = sys.argv[1:]
time.sleep(1)
for _ in range(60):
    # /proc/<pid>/stat field 39 (processor); the fields after the ")" of comm start at field 3
    print(" ".join(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[36] for p in pids))
    time.sleep(0.05)
for p in pids:
    print(next(line.strip() for line in open(f"/proc/{p}/status") if line.startswith("Cpus_allowed_list")))
PY
    }
    bundle hostiso 1 sleep 100000
    python3 -c 'import json, sys; p = sys.argv[1]; s = json.load(open(p)); s["annotations"]["numa-pin.io/host-services"] = "disable"; s["linux"]["cgroupsPath"] = "machine.slice:runc:hostiso"; json.dump(s, open(p, "w"))' /run/bundles/hostiso/config.json
    rec hostiso-start start_detached hostiso np-hostiso
    for n in 1 2 3 4; do systemd-run --unit "np-hostloop$n" -p Nice=19 sh -c 'while :; do :; done' > /dev/null 2>&1; done
    rec hostiso-status numa-pin status --json
    rec hostiso-explain numa-pin explain np-hostiso --json
    rec hostiso-slice unit_state system.slice
    rec hostiso-loop unit_state np-hostloop1.service
    rec hostiso-during sample_loops
    systemctl daemon-reload
    rec hostiso-slice-reload unit_state system.slice
    rec hostiso-reload sample_loops
    rec hostiso-release runc --systemd-cgroup delete -f np-hostiso
    rec hostiso-status-after numa-pin status --json
    rec hostiso-slice-after unit_state system.slice
    rec hostiso-after sample_loops
    for n in 1 2 3 4; do systemctl stop "np-hostloop$n" > /dev/null 2>&1; done

    # item 1 with containerd: docs/install.md's `ctr run --config` recipe, as written
    mkdir -p /run/ctr-readme
    rec ctr-readme sh -c "cd /run/ctr-readme && bash /usr/local/share/np-readme-ctr.sh"

    # item 3: reboot with live grants (np-excl, np-shared and a podman one); issue 35 item 1: an
    # isolated grant whose container is killed with -9 (no poststop), then a power cut
    podman run -d --name np-live --network none --annotation numa-pin.io/cpus=1 --rootfs "$R" sleep 100000 \
        > "$O/np-live.log" 2>&1
    rec crash-orig host_state
    isolated crash
    rec crash-start start_detached crash np-crash
    rec crash-held host_state
    kill -9 "$(runc --systemd-cgroup state np-crash | python3 -c 'import json, sys; print(json.load(sys.stdin)["pid"])')"
    rec status-before-reboot numa-pin status --json
    rec journal-1 journalctl -b --no-pager -o short-monotonic -t numa-pin -t numa-pin-hook
    sync
    touch /run/numa-pin-scenario-reboot
    echo 1 > /proc/sys/kernel/sysrq
    echo b > /proc/sysrq-trigger  # the power cut: no shutdown, no poststop, nothing written back
    exit 0
fi

# boot 2: what this boot has before any grant, then an isolated grant and its release
rec boot2-orig host_state
rec status-after-reboot numa-pin status --json
isolated again
rec again-start start_detached again np-again
rec again-held host_state
rec again-release runc --systemd-cgroup delete -f np-again
rec again-after host_state
rec journal-released journalctl -b -t numa-pin --no-pager -o cat
rec agent-socket systemctl is-active numa-pin-agent.socket
rec podman-agent podman run --rm --network none --annotation numa-pin.io/cpus=1 --rootfs "$R" sh -c "$SHOW"
rec agent-service systemctl is-active numa-pin-agent.service
rec purge dpkg --purge numa-pin
rec units-after-purge systemctl list-units --all --no-legend --plain 'numa-pin*'
rec podman-after-purge podman run --rm --network none --rootfs "$R" sh -c "$SHOW"
exit 0
