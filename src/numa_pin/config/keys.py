"""The configuration key table: every key's dotted name, type, default and meaning (pure).

:data:`ITEMS` is the single source of truth. :mod:`numa_pin.config.model` takes its
record defaults from it, :func:`numa_pin.config.schema.config_from_dict` validates
against it with each item's parser (:mod:`numa_pin.config.parse`), and
:mod:`numa_pin.config.render` writes ``packaging/config.yaml`` and the docs' table from it.
"""

from __future__ import annotations

from collections.abc import Callable

from numa_pin.base import names
from numa_pin.base.record import field, record
from numa_pin.config import parse as p
from numa_pin.devices.selector import SELECTOR_KEYS

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)
if TYPE_CHECKING:
    from typing import Any


@record
class ConfigItem:
    """One configuration key: dotted name, type, default (as YAML writes it), meaning."""

    key: str
    type: str
    default: Any
    meaning: str
    parse: Callable[[Any, str], Any] = field(repr=False, compare=False)
    example: str = ""  # a commented YAML snippet for the sample file


_BOOLISH = "bool (true/false, 1/0, Go ParseBool strings)"

ITEMS: tuple[ConfigItem, ...] = (
    ConfigItem(
        "policy", "one of " + ", ".join(p.POLICIES), names.DEFAULT_POLICY,
        "Topology Manager policy, with kubelet's semantics.", p.enum_of(p.POLICIES),
    ),
    ConfigItem(
        "scope", "one of " + ", ".join(p.SCOPES), names.DEFAULT_SCOPE,
        "Topology Manager scope: align each container, or a whole pod at once.", p.enum_of(p.SCOPES),
    ),
    ConfigItem(
        "policy_options", "mapping option name -> string, bool or int", {},
        "Topology Manager policy options by kubelet name (" + ", ".join(p.POLICY_OPTIONS) + "). "
        "Values are kept as written; the policy parses them as kubelet does.",
        p.policy_options,
        example="policy_options:\n  prefer-closest-numa-nodes: \"true\"\n  max-allowable-numa-nodes: 16",
    ),
    *(
        ConfigItem(f"cpu_manager.options.{name}", _BOOLISH, False, meaning, p.boolish)
        for name, meaning in (
            ("full-pcpus-only", ("Give exclusive CPUs as whole physical cores only; a request "
             "that is not a multiple of the threads per core fails (SMTAlignmentError).")),
            ("distribute-cpus-across-numa", ("Spread exclusive CPUs evenly over the NUMA nodes "
             "a container needs instead of filling one node first.")),
            ("distribute-cpus-across-cores", ("Spread exclusive CPUs over physical cores, one "
             "thread per core first.")),
            ("prefer-align-cpus-by-uncorecache", ("Prefer exclusive CPUs that share an uncore "
             "(L3) cache.")),
            ("strict-cpu-reservation", "Keep the reserved CPUs out of the shared pool too."),
            ("align-by-socket", ("Align exclusive CPUs to whole sockets rather than NUMA nodes "
             "(refused with single-numa-node).")),
        )
    ),
    ConfigItem(
        "cpu_manager.reserved_cpus", "cpulist string or null", None,
        "CPUs kept out of exclusive allocation (kubelet reservedSystemCPUs). "
        "When set, the number reserved is its size, as kubelet derives it; a num_reserved_cpus "
        "set beside it must equal that size (kubelet refuses the disagreement).", p.cpulist,
    ),
    ConfigItem(
        "cpu_manager.num_reserved_cpus", "int >= 0", 1,
        "How many CPUs to reserve when reserved_cpus is null, picked as kubelet does; "
        "1 keeps the shared pool from ever emptying.", p.count,
    ),
    ConfigItem(
        "reserved_memory", "mapping NUMA node -> {resource: quantity}", {},
        "Memory kept from the memory manager per node; resources are memory and "
        "hugepages-<size>; quantities are Kubernetes quantities (1Gi).", p.reserved_memory,
        example="reserved_memory:\n  0:\n    memory: 1Gi\n    hugepages-2Mi: 256Mi",
    ),
    ConfigItem(
        "memory_tiers", "mapping tier name -> NUMA node list", {},
        "Memory tiers a request may add to its memory nodes with numa-pin.io/memory-tier: "
        "usually CPU-less nodes (CXL expanders, HBM) that no CPU alignment would ever pick. "
        "The tier's nodes join the grant's cpuset.mems and its memory policy.", p.memory_tiers,
        example="memory_tiers:\n  cxl: \"2\"",
    ),
    ConfigItem(
        "devices", "mapping resource name -> list of selectors", {},
        "Device resources numa-pin allocates and the PCI devices that belong to each. "
        "A device matches a selector when it matches every key given (any value in a "
        "list); it belongs to the resource when it matches any selector. Keys: "
        + ", ".join(SELECTOR_KEYS) + ".", p.devices,
        example=(
            "devices:\n  nvidia.com/gpu:\n    - vendors: [\"0x10de\"]\n      classes: [\"0x0302\"]\n"
            "  intel.com/sriov_netdevice:\n    - vendors: [\"8086\"]\n      drivers: [iavf]\n"
            "      pf_names: [ens1f0]\n      is_vf: true"
        ),
    ),
    ConfigItem(
        "inference.guaranteed_cpus", "bool", True,
        "Without a numa-pin annotation, give a Kubernetes container (CRI annotations "
        "present) of a Guaranteed pod whose CPU quota is a whole number of CPUs and that has a "
        "memory limit that many exclusive CPUs, as kubelet's static CPU manager would. The pod's "
        "QoS class comes from the container's cgroup parent (kubepods/burstable, "
        "kubepods-besteffort-...slice), else from cpu.shares against the quota.", p.boolean,
    ),
    ConfigItem(
        "inference.guaranteed_cpus_outside_kubernetes", "bool", False,
        "Apply that inference to every container, not only Kubernetes ones: a plain "
        "`podman run --cpus 1 --memory 100m` then gets an exclusive CPU.", p.boolean,
    ),
    ConfigItem(
        "inference.hugepages", "bool", True,
        "Infer hugepage requests from the OCI spec's hugepage limits.", p.boolean,
    ),
    ConfigItem(
        "inference.device_plugin_env", "bool", True,
        "Infer device requests from device-plugin environment variables "
        "(NVIDIA_VISIBLE_DEVICES, PCIDEVICE_*).", p.boolean,
    ),
    ConfigItem(
        "inference.device_nodes", "bool", True,
        "Align CPUs and memory to the PCI devices behind the device nodes a container's spec "
        "already carries (linux.devices) and behind CDI names of any kind (resolved through "
        "the CDI spec files), whoever chose them: a device plugin, a DRA driver, --device.",
        p.boolean,
    ),
    ConfigItem(
        "inference.strict_devices", "bool", False,
        "Reject a container that carries a device numa-pin cannot place (a CDI name no spec "
        "file names, a node with no PCI function behind it). Off: it is admitted without a "
        "hint for that device, and `numa-pin explain` says why.", p.boolean,
    ),
    *(
        ConfigItem(f"isolation.{knob}", kind, None, meaning, p.isolation_knob(knob))
        for knob, kind, meaning in (
            ("load_balancing", "null or disable", "Node default of cpu-load-balancing.crio.io for containers "
             "with exclusive CPUs: disable takes their CPUs out of the scheduler's load balancing."),
            ("quota", "null or disable", "Node default of cpu-quota.crio.io: disable lifts the CFS quota "
             "of containers with exclusive CPUs (cpu.max max, cpu.cfs_quota_us -1)."),
            ("irq", "null, disable or housekeeping", "Node default of irq-load-balancing.crio.io: move "
             "device interrupts off exclusive CPUs (housekeeping: keep them on the first core only)."),
            ("c_states", "null, enable, disable or max_latency:N", "Node default of cpu-c-states.crio.io: "
             "the resume latency limit (power/pm_qos_resume_latency_us) of exclusive CPUs."),
            ("governor", "null or a cpufreq governor name", "Node default of cpu-freq-governor.crio.io: the "
             "cpufreq governor of exclusive CPUs (performance)."),
            ("exec_cpu_affinity", "null, first or default", "Node default of numa-pin.io/exec-cpu-affinity "
             "(CRI-O's exec_cpu_affinity): first writes process.execCPUAffinity final = the first exclusive "
             "CPU into the config of a container with exclusive CPUs, so its exec'd processes (probes, "
             "exec) stay on that one CPU; only podman's precreate path with a runtime-spec 1.2 config "
             "carries it (docs/exec-affinity.md). Off (null) by default, as in CRI-O."),
        )
    ),
    ConfigItem(
        "isolation.host", "bool", False,
        "Keep host services (system.slice, user.slice, init.scope and the other top-level cgroups that "
        "are not containers) off every exclusive CPU; a container may ask it alone with "
        "numa-pin.io/host-services: disable.", p.boolean,
    ),
    ConfigItem(
        "isolation.isolated_cpus", "one of " + ", ".join(p.ISOLATED_CPUS), "prefer",
        "Exclusive CPUs and the kernel's isolated CPUs (isolcpus, nohz_full): prefer them, require "
        "them (a container that cannot have only isolated CPUs is refused), or avoid them.",
        p.enum_of(p.ISOLATED_CPUS),
    ),
    ConfigItem(
        "isolation.shared_pool_isolated", "bool", False,
        "Let the shared pool hold the kernel's isolated CPUs (by default it never does).", p.boolean,
    ),
    ConfigItem("sysfs_root", "absolute path", "/sys", "Where sysfs is mounted.", p.abs_path),
    ConfigItem("proc_root", "absolute path", "/proc", "Where procfs is mounted.", p.abs_path),
    ConfigItem("dev_root", "absolute path", "/dev", "Where the host's device nodes are.", p.abs_path),
    ConfigItem(
        "cdi_spec_dirs", "list of absolute paths", ["/etc/cdi", "/var/run/cdi"],
        "Directories of CDI spec files (JSON or YAML); a later directory wins for a device "
        "named in several.", p.abs_paths,
    ),
    ConfigItem(
        "cgroup_root", "absolute path", "/sys/fs/cgroup",
        "The cgroup mount root (v2), or the directory holding the v1 hierarchies.", p.abs_path,
    ),
    ConfigItem(
        "state_dir", "absolute path", "/var/lib/numa-pin",
        "Directory of the node ledger (ledger.json, ledger.log, ledger.lock).", p.abs_path,
    ),
    ConfigItem(
        "kubelet_root", "absolute path", "/var/lib/kubelet",
        "kubelet's root directory: the hook warns when its cpu_manager_state checkpoint shows the "
        "static CPU manager policy (two allocators for the same CPUs); serve --nri refuses to start when "
        "its config.yaml or its cpu_manager_state or memory_manager_state says static (docs/kubernetes.md); "
        "nrt signs the pods of its pod-resources/kubelet.sock.", p.abs_path,
    ),
    ConfigItem(
        "lock_timeout_s", "number of seconds (0-3600)", 10,
        "How long an admission waits for the ledger lock before failing.", p.seconds,
    ),
    ConfigItem(
        "admission_timeout_s", "number of seconds (0-3600)", 20,
        "Deadline of one admission, lock wait included; a hook's counts from the hook process's start, "
        "so keep it below the runtime's hook timeout (30 s in the shipped hooks.d files). Past it the "
        "container is rejected with AdmissionTimeout.",
        p.seconds,
    ),
    ConfigItem(
        "syslog", "bool", True,
        "Also log decisions and errors to syslog (runtimes often drop hook stderr).", p.boolean,
    ),
    ConfigItem(
        "metrics_address", "HOST:PORT string or null", None,
        "Where the agent (numa-pin serve) serves Prometheus metrics over HTTP, e.g. 127.0.0.1:9464; "
        "null: not served (numa-pin metrics --textfile writes the same for node_exporter).", p.listen_address,
    ),
    ConfigItem(
        "resize_follow", "one of " + ", ".join(p.RESIZE_FOLLOW), "reassert",
        "What reconcile does with an exclusive container whose cpuset.cpus a runtime changed (runc update "
        "--cpuset-cpus), and the NRI plugin with kubelet's in-place resize of its CPU count: reassert writes "
        "the ledger's CPUs back (NRI: refuses the resize in one line); adopt records the new CPUs as a resize "
        "when they keep the ones it was admitted with and add only free CPUs of its NUMA affinity, or, under "
        "best-effort and none, CPUs of other nodes once its affinity could not hold them all (else reasserts).",
        p.enum_of(p.RESIZE_FOLLOW),
    ),
)

#: dotted key -> its item
BY_KEY: dict[str, ConfigItem] = {item.key: item for item in ITEMS}


def _children() -> dict[str, tuple[str, ...]]:
    """Section prefix ("" for the top) -> its child names, in table order."""
    out: dict[str, list[str]] = {}
    for item in ITEMS:
        parts = item.key.split(".")
        for depth in range(len(parts)):
            prefix = ".".join(parts[:depth])
            names = out.setdefault(prefix, [])
            if parts[depth] not in names:
                names.append(parts[depth])
    return {prefix: tuple(names) for prefix, names in out.items()}


#: section prefix ("" for the top) -> its child names, in table order
CHILDREN = _children()


def default(key: str) -> Any:
    """The parsed built-in default of ``key``."""
    item = BY_KEY[key]
    return item.parse(item.default, key)


__all__ = ["BY_KEY", "CHILDREN", "ITEMS", "ConfigItem", "default"]
