#!/usr/bin/env bash
# numa-pin's main job, for real: discover this machine, then start real runc containers with
# numa-pin-hook and show an exclusive grant, the shared pool shrinking, a rejection with its
# one-line reason, and the release. Everything lives in a temporary directory.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV_BIN="$PWD/.venv/bin"
HOOK="$VENV_BIN/numa-pin-hook"
NP="$VENV_BIN/numa-pin"
[ "$(id -u)" -eq 0 ] || { echo "make demo drives runc and cgroups: run it as root" >&2; exit 1; }
WORK=$(mktemp -d /run/numa-pin-demo.XXXXXX)
RUNC_ROOT="$WORK/runc"
cleanup() {
    for c in $(runc --root "$RUNC_ROOT" list -q 2>/dev/null); do runc --root "$RUNC_ROOT" delete --force "$c" >/dev/null 2>&1 || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

cat > "$WORK/config.yaml" <<CFG
policy: restricted
state_dir: $WORK/state
syslog: false
CFG

step "The machine, as numa-pin discovers it from /sys"
"$NP" topology

step "Dry run: what would a 1-CPU exclusive container get?"
"$NP" plan --config "$WORK/config.yaml" --cpus 1 || true

# a busybox rootfs and bundles wired to the hook (prestart admits, poststop releases)
mkdir -p "$WORK/rootfs/bin" "$WORK/rootfs/proc" "$WORK/rootfs/sys" "$WORK/rootfs/dev" "$WORK/rootfs/tmp"
cp /bin/busybox "$WORK/rootfs/bin/busybox"
for a in sh cat grep sleep true; do ln -sf busybox "$WORK/rootfs/bin/$a"; done
bundle() {  # bundle NAME CPUS ARGS-JSON
    local dir="$WORK/$1"; mkdir -p "$dir"
    (cd "$dir" && runc spec)
    "$VENV_BIN/python" - "$dir/config.json" "$2" "$3" "$HOOK" "$WORK" <<'PY'
import json, sys
path, cpus, args, hook, work = sys.argv[1:]
spec = json.load(open(path))
spec["process"]["terminal"] = False
spec["process"]["args"] = json.loads(args)
spec["root"] = {"path": f"{work}/rootfs", "readonly": True}
if cpus != "0":
    spec["annotations"] = {"numa-pin.io/cpus": cpus}
env = ["PATH=/usr/sbin:/usr/bin:/sbin:/bin", f"NUMA_PIN_CACHE_DIR={work}/cache"]
entry = lambda stage: {"path": hook, "args": ["numa-pin-hook", "--config", f"{work}/config.yaml", stage], "env": env, "timeout": 30}
spec["hooks"] = {"prestart": [entry("prestart")], "poststop": [entry("poststop")]}
json.dump(spec, open(path, "w"), indent=1)
PY
}
SHOW='["sh","-c","grep -E \"^(Cpus|Mems)_allowed_list\" /proc/self/status"]'
bundle shared 0 '["sleep","600"]'
bundle exclusive 1 '["sleep","600"]'
bundle another 1 "$SHOW"
cgcpus() { cat "/sys/fs/cgroup/cpuset$(awk -F: '$2 ~ /cpuset/ {print $3}' /proc/"$1"/cgroup)/cpuset.cpus"; }

step "A shared container (no numa-pin annotation) joins the shared pool"
runc --root "$RUNC_ROOT" run -d --bundle "$WORK/shared" demo-shared >/dev/null
SPID=$(runc --root "$RUNC_ROOT" state demo-shared | "$VENV_BIN/python" -c 'import json,sys; print(json.load(sys.stdin)["pid"])')
echo "demo-shared cpuset.cpus = $(cgcpus "$SPID")"

step "An exclusive container (numa-pin.io/cpus=1) gets a CPU of its own"
runc --root "$RUNC_ROOT" run -d --bundle "$WORK/exclusive" demo-exclusive >/dev/null
XPID=$(runc --root "$RUNC_ROOT" state demo-exclusive | "$VENV_BIN/python" -c 'import json,sys; print(json.load(sys.stdin)["pid"])')
echo "demo-exclusive cpuset.cpus = $(cgcpus "$XPID")"
echo "demo-shared    cpuset.cpus = $(cgcpus "$SPID")   (shrunk: exclusive means exclusive)"
"$NP" status --config "$WORK/config.yaml"

step "One more exclusive container: nothing is left, so restricted rejects it"
if runc --root "$RUNC_ROOT" run --bundle "$WORK/another" demo-rejected 2>"$WORK/err"; then
    echo "unexpected: admitted"
else
    grep -o 'numa-pin: rejected[^"\\]*' "$WORK/err" | head -1
fi
"$NP" explain --config "$WORK/config.yaml" demo-rejected

step "The exclusive container exits; poststop releases its CPU"
runc --root "$RUNC_ROOT" delete --force demo-exclusive
echo "demo-shared cpuset.cpus = $(cgcpus "$SPID")   (grown back)"

step "Now the same request is admitted"
runc --root "$RUNC_ROOT" run --bundle "$WORK/another" demo-admitted
runc --root "$RUNC_ROOT" delete --force demo-shared
"$NP" status --config "$WORK/config.yaml"
