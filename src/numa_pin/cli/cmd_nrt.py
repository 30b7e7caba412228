"""``numa-pin nrt``: this node as a ``topology.node.k8s.io/v1alpha2`` ``NodeResourceTopology``.

One shot: print the object as YAML (``--json``: JSON). ``--watch --output FILE``: keep FILE
current; every ``--interval`` seconds the ledger file is checked, and when it (or the object)
changed the object is rebuilt and FILE is replaced atomically (temporary file, fsync, rename).
After each new version, when ``kubectl`` is on PATH and a kubeconfig exists (``--kubeconfig``,
else ``$KUBECONFIG``, else ``~/.kube/config``), ``kubectl apply -f FILE`` publishes it; a failed
apply is reported on stderr and retried with the next change. SIGTERM/SIGINT stop the watch.

The ``nodeTopologyPodsFingerprint`` attribute signs the pods kubelet runs, read from kubelet's
pod-resources API (``--pod-resources SOCKET``; by default ``<kubelet_root>/pod-resources/kubelet.sock``
when that socket exists; :mod:`numa_pin.podresources.client`), asked again at every check of
``--watch``. ``--pods FILE`` (offline, instead of the socket): the pods bound to this node
(``kubectl get pods -A --field-selector spec.nodeName=NODE -o json``, or a list of
``{namespace, name}``); re-read with every rebuild, and a change to it triggers one as a ledger
change does. With neither (no kubelet here) the object carries no fingerprint.

The object itself is built by :func:`numa_pin.cluster.nrt.build_nrt` (pure).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from numa_pin.cli.common import add_config_argument, load
from numa_pin.cli.main import write_out
from numa_pin.errors import NumaPinError

NAME = "nrt"
HELP = "print this node as a NodeResourceTopology (v1alpha2) for the topology-aware scheduler"

DEFAULT_SYSFS_ROOT = "/sys"
DEFAULT_PROC_ROOT = "/proc"
DEFAULT_INTERVAL_S = 2.0
#: the pods file: a node's PodList from kubectl stays well below this
PODS_LIMIT = 64 << 20
DEFAULT_POD_RESOURCES_TIMEOUT_S = 5.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("--node-name", metavar="NAME", help="metadata.name (default: this host's name)")
    parser.add_argument("--sysfs-root", metavar="DIR", help="sysfs tree to read (default: the config's sysfs_root)")
    parser.add_argument(
        "--proc-root", metavar="DIR",
        help="proc tree (default: the config's proc_root; none when only --sysfs-root is given)",
    )
    pods = parser.add_mutually_exclusive_group()
    pods.add_argument("--pod-resources", metavar="SOCKET",
                      help="kubelet's pod-resources socket, whose pods the nodeTopologyPodsFingerprint attribute "
                      "signs (default: <kubelet_root>/pod-resources/kubelet.sock when it exists)")
    pods.add_argument("--pods", metavar="FILE",
                      help="offline, instead of kubelet's socket: the pods on this node (a PodList as JSON) for "
                      "the nodeTopologyPodsFingerprint attribute")
    parser.add_argument("--pod-resources-timeout", metavar="S", type=float, default=DEFAULT_POD_RESOURCES_TIMEOUT_S,
                        help="seconds kubelet has to answer each pod-resources call "
                        f"(default {DEFAULT_POD_RESOURCES_TIMEOUT_S:g})")
    parser.add_argument("--json", action="store_true", help="print JSON instead of YAML")
    parser.add_argument("--watch", action="store_true", help="keep --output current until stopped")
    parser.add_argument("--output", metavar="FILE", help="with --watch: the file to keep current")
    parser.add_argument("--interval", metavar="S", type=float, default=DEFAULT_INTERVAL_S,
                        help=f"with --watch: seconds between ledger checks (default {DEFAULT_INTERVAL_S:g})")
    parser.add_argument("--kubeconfig", metavar="PATH",
                        help="with --watch: kubeconfig for kubectl apply (default $KUBECONFIG, else ~/.kube/config)")


def render(obj: Mapping[str, Any], as_json: bool) -> str:
    """The object as JSON (2-space indent) or block-style YAML, keys in the object's order."""
    if as_json:
        return json.dumps(obj, indent=2) + "\n"
    import yaml

    return str(yaml.safe_dump(dict(obj), sort_keys=False, default_flow_style=False))


def roots(args: argparse.Namespace, config: Any) -> tuple[str, str | None]:
    """(sysfs root, proc root): flags win over the config; a fake sysfs never gets the live /proc."""
    if args.sysfs_root is None:
        return config.sysfs_root, args.proc_root or config.proc_root
    proc = args.proc_root
    if proc is None and args.sysfs_root == DEFAULT_SYSFS_ROOT:
        proc = DEFAULT_PROC_ROOT
    return args.sysfs_root, proc


def read_pods(path: str, node_name: str) -> list[tuple[str, str]]:
    """``(namespace, name)`` of the pods in the JSON file ``path`` that count for ``node_name``
    (:func:`numa_pin.cluster.nrt.pods_on_node`). Raises RequestError naming the file."""
    from numa_pin.base.boundedio import json_loads_bounded, read_regular_file
    from numa_pin.cluster.nrt import pods_on_node
    from numa_pin.errors import RequestError

    try:
        doc = json_loads_bounded(read_regular_file(path, PODS_LIMIT))
        return pods_on_node(doc, node_name)
    except RequestError as exc:
        raise RequestError(f"{path}: {exc}", annotation="--pods") from exc
    except (OSError, ValueError) as exc:
        raise RequestError(f"{path}: cannot read the pods: {exc}", annotation="--pods") from exc


def pod_resources_socket(flag: str | None, kubelet_root: str) -> str | None:
    """The pod-resources socket to ask: the flag's, else kubelet's under ``kubelet_root`` when
    something is there (None: no kubelet on this node, no fingerprint)."""
    from numa_pin.podresources.client import socket_path

    if flag:
        return flag
    default = socket_path(kubelet_root)
    return default if os.path.lexists(default) else None


def read_pod_resources(path: str, timeout_s: float) -> list[tuple[str, str]]:
    """``(namespace, name)`` of the pods kubelet runs, from its pod-resources socket ``path``.
    Raises KubeletError naming the socket."""
    from numa_pin.podresources.client import PodResourcesClient, pod_names

    with PodResourcesClient(path, timeout_s=timeout_s) as client:
        return pod_names(client.list())


def builder(args: argparse.Namespace) -> tuple[Callable[[], dict[str, Any]], tuple[str, ...] | None]:
    """A function that rebuilds the object from the ledger (and the pods; the topology is
    read once), and the files whose change calls for a rebuild (None: rebuild at every check,
    since kubelet's pods are asked, not watched). Raises ConfigError, TopologyError,
    PolicyError."""
    config = load(args)
    sysfs_root, proc_root = roots(args, config)
    socket_path = None if args.pods else pod_resources_socket(args.pod_resources, config.kubelet_root)
    build, watched = node_builder(config, sysfs_root, proc_root, args.node_name or socket.gethostname(), args.pods,
                                  socket_path, args.pod_resources_timeout)
    return build, None if socket_path else watched


def node_builder(config: Any, sysfs_root: str, proc_root: str | None, node_name: str,
                 pods_path: str | None = None, socket_path: str | None = None,
                 timeout_s: float = DEFAULT_POD_RESOURCES_TIMEOUT_S,
                 ) -> tuple[Callable[[], dict[str, Any]], tuple[str, ...]]:
    """:func:`builder` of a loaded config and explicit roots (what ``serve --publish-nrt``
    publishes is what this command prints): the pods from ``pods_path``, else from kubelet's
    pod-resources ``socket_path`` (None: no fingerprint), and the files whose change calls for a
    rebuild (the ledger and its journal, which change as kubelet's pods come and go, and ``pods_path``)."""
    from numa_pin.cluster.nrt import build_nrt, reserved_cpus_of
    from numa_pin.devices.inventory import inventory
    from numa_pin.ledger.store import Ledger
    from numa_pin.service.node import settings_from_config
    from numa_pin.topology.discover import discover

    topology = discover(sysfs_root, proc_root)
    settings = settings_from_config(config)
    devices = inventory(topology, settings.device_resources)
    reserved = reserved_cpus_of(topology, settings)
    ledger = Ledger(config.state_dir, lock_timeout=config.lock_timeout_s)

    def build() -> dict[str, Any]:
        pods = None
        if pods_path:
            pods = read_pods(pods_path, node_name)
        elif socket_path:
            pods = read_pod_resources(socket_path, timeout_s)
        return build_nrt(topology, settings, ledger.read(), devices, node_name, reserved, pods)

    return build, (ledger.path, ledger.journal_path) + ((pods_path,) if pods_path else ())


def write_atomic(path: str, text: str) -> None:
    """Replace ``path`` (mode 0644) with ``text`` so readers, and a crash at any instant, see the
    old or the new file, never a part (:func:`numa_pin.base.safefs.replace_private`). Raises OSError."""
    from numa_pin.base.safefs import replace_private

    directory = os.path.dirname(os.path.abspath(path))
    replace_private(directory, path, text.encode("utf-8"), prefix=f".{os.path.basename(path)}.", mode=0o644,
                    durable=True)


def kubeconfig_path(flag: str | None, env: Mapping[str, str]) -> str | None:
    """The kubeconfig ``kubectl apply`` uses: the flag, else ``$KUBECONFIG`` (first entry),
    else ``~/.kube/config``; None when that file does not exist."""
    candidate = flag or (env.get("KUBECONFIG", "").split(os.pathsep)[0] or None)
    if candidate is None:
        home = env.get("HOME") or os.path.expanduser("~")
        candidate = os.path.join(home, ".kube", "config")
    return candidate if os.path.isfile(candidate) else None


def apply(kubectl: str, kubeconfig: str, path: str) -> str | None:
    """``kubectl --kubeconfig K apply -f path``; None on success, else one line saying why."""
    import subprocess

    try:
        done = subprocess.run([kubectl, "--kubeconfig", kubeconfig, "apply", "-f", path],
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"kubectl apply -f {path}: {exc}"
    if done.returncode != 0:
        return f"kubectl apply -f {path}: " + " ".join((done.stderr or done.stdout).split())
    return None


def watch(
    build: Callable[[], dict[str, Any]],
    ledger_path: str | tuple[str, ...] | None,
    output: str,
    *,
    as_json: bool,
    interval: float,
    publish: Callable[[str], str | None] | None,
    stopped: Callable[[], bool],
    err: Any = None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Keep ``output`` current until ``stopped()``; returns the number of versions written.

    The ledger file (and every other path in ``ledger_path`` when it is a tuple) is stat'ed
    every ``interval`` seconds; the object is rebuilt when a stat changed (``ledger_path`` None:
    at every check), and written (then ``publish``\\ ed) only when its text changed. An error while building or
    writing is reported on ``err`` and retried at the next check."""
    from numa_pin.cluster.nrtpublish import file_stamps

    err = err or sys.stderr
    paths = (ledger_path,) if isinstance(ledger_path, str) else ledger_path
    seen: object = False  # False: never looked
    last_text: str | None = None
    written = 0
    while not stopped():
        stamp = file_stamps(paths) if paths is not None else None
        if stamp != seen or last_text is None or ledger_path is None:
            try:
                text = render(build(), as_json)
                if text != last_text:
                    write_atomic(output, text)
                    written += 1
                    last_text = text
                    problem = publish(output) if publish is not None else None
                    if problem:
                        print(f"numa-pin nrt: {problem}", file=err, flush=True)
                seen = stamp
            except NumaPinError as exc:  # a corrupt ledger, a config that no longer fits: keep watching
                print(f"numa-pin nrt: {exc.kind}: {exc}", file=err, flush=True)
            except (OSError, ValueError) as exc:
                print(f"numa-pin nrt: {output}: {exc}", file=err, flush=True)
        if stopped():
            break
        sleep(interval)
    return written


def run(args: argparse.Namespace) -> int:
    from numa_pin.errors import RequestError

    if args.watch and not args.output:
        raise RequestError("--watch needs --output FILE", annotation="--output")
    if args.output and not args.watch:
        raise RequestError("--output is for --watch; without it the object goes to stdout", annotation="--output")
    if not args.pod_resources_timeout > 0:
        raise RequestError(f"--pod-resources-timeout must be a positive number of seconds, got "
                           f"{args.pod_resources_timeout}", annotation="--pod-resources-timeout")
    if not args.interval > 0:
        raise RequestError(f"--interval must be a positive number of seconds, got {args.interval}",
                           annotation="--interval")
    build, watched = builder(args)
    if not args.watch:
        write_out(render(build(), args.json))
        return 0

    import shutil

    kubectl = shutil.which("kubectl")
    kubeconfig = kubeconfig_path(args.kubeconfig, os.environ)
    publish = None
    if kubectl and kubeconfig:
        def publish(path: str) -> str | None:
            return apply(kubectl, kubeconfig, path)
        print(f"numa-pin nrt: keeping {args.output} current, applying it with {kubectl} ({kubeconfig})",
              file=sys.stderr, flush=True)
    else:
        why = "kubectl is not on PATH" if not kubectl else "no kubeconfig found"
        print(f"numa-pin nrt: keeping {args.output} current (not applying it: {why})", file=sys.stderr, flush=True)
    stop = {"now": False}

    def on_signal(_signum: int, _frame: object) -> None:
        stop["now"] = True

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    watch(build, watched, args.output, as_json=args.json, interval=args.interval, publish=publish,
          stopped=lambda: stop["now"], sleep=lambda s: _sleep_unless(s, stop))
    return 0


def _sleep_unless(seconds: float, stop: Mapping[str, bool]) -> None:
    """Sleep in short steps so a signal ends the watch promptly."""
    deadline = time.monotonic() + seconds
    while not stop["now"]:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(left, 0.1))
