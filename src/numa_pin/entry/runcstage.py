"""What ``numa-pin-runc`` does around runc's ``create`` and ``delete`` (:mod:`numa_pin.entry.runc`).

``create``: the bundle's ``config.json`` goes through the precreate stage of the hook
(:func:`numa_pin.hook.invoke.run`, the path podman's precreate hook takes: request, admission with the
precreate target, :func:`numa_pin.hook.precreate.edit_spec`), with the container's
``NUMA_PIN_IO_*`` variables added as annotations first; the edited config replaces the old one
atomically (a new file in the bundle, renamed over it) and runc runs with the original arguments.
The grant is keyed by the id the config's ``linux.cgroupsPath`` names (Docker: ``/docker/<id>``
or ``system.slice:docker:<id>``); a config whose path names another container than runc's
command line is refused, so a grant can always be released by runc's id.

Nothing stays held when something fails: a refusal exits before runc runs (the admission rolls
itself back), and a grant whose runc ``create`` or ``delete`` failed is released as soon as
``runc state`` says runc no longer knows the container. A live container whose delete failed
keeps its CPUs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from numa_pin.hook.invoke import HOOK_ENV, HookRequest
from numa_pin.hook.invoke import run as invoke

TYPE_CHECKING = False  # typing's flag without importing typing (this runs on every Docker container create)
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any

    from numa_pin.entry.runcargs import Invocation

CONFIG_NAME = "config.json"
#: the environment prefix that stands for ``numa-pin.io/`` in a container's ``process.env``
ENV_PREFIX = "NUMA_PIN_IO_"
ANNOTATION_PREFIX = "numa-pin.io/"


def _print(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _cwd() -> str:
    try:
        return os.getcwd()
    except OSError:  # a deleted working directory: only absolute paths mean anything
        return "/"


def _hook(stage: str, data: bytes, env: Mapping[str, str], say: Callable[[str], None]) -> tuple[int, bytes]:
    """One hook stage in this process, its lines handed to ``say`` as they come: exit code and stdout."""
    hook_env = {k: env[k] for k in HOOK_ENV if k in env}
    result = invoke(HookRequest((stage,), hook_env, data, _cwd()), on_line=say)
    return result.code, result.stdout


def env_annotations(env: Sequence[object], known: Sequence[str]) -> dict[str, str]:
    """The annotations a container's ``process.env`` asks for (pure): ``NUMA_PIN_IO_<KEY>=value``
    becomes ``numa-pin.io/<key>``, ``<key>`` being the known key whose upper case, with ``-`` as
    ``_``, is ``<KEY>`` (``known``: keys after the prefix), else ``<KEY>`` in lower case with
    ``_`` as ``-`` (which the request then refuses as unknown, naming it). Entries that are not
    strings or not of that form are skipped; a later entry wins, as in an environment."""
    table = {key.upper().replace("-", "_"): key for key in known}
    out: dict[str, str] = {}
    for entry in env:
        if not isinstance(entry, str) or not entry.startswith(ENV_PREFIX):
            continue
        name, sep, value = entry.partition("=")
        suffix = name[len(ENV_PREFIX):]
        if sep and suffix:
            out[ANNOTATION_PREFIX + table.get(suffix, suffix.lower().replace("_", "-"))] = value
    return out


def known_keys() -> tuple[str, ...]:
    """The request's annotation keys after ``numa-pin.io/`` (:mod:`numa_pin.requests.request`)."""
    from numa_pin.requests.isolation import NUMA_PIN_KEYS
    from numa_pin.requests.request import PER_CONTAINER

    return (*PER_CONTAINER, "policy", "scope", "pod", "pod-cpus", "pod-memory", "pod-devices", *NUMA_PIN_KEYS)


def with_env_annotations(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with the annotations its ``process.env`` asks for (:func:`env_annotations`) added
    where ``annotations`` has no value of its own; ``doc`` itself when there are none."""
    process = doc.get("process")
    env = process.get("env") if isinstance(process, dict) else None
    asked = env_annotations(env, known_keys()) if isinstance(env, list) else {}
    present = doc.get("annotations")
    if not asked or (present is not None and not isinstance(present, dict)):
        return doc  # a malformed annotations field is the request parser's to refuse
    return {**doc, "annotations": {**asked, **(present or {})}}


def write_atomically(path: str, data: bytes) -> None:
    """Replace ``path`` by a file holding ``data``, with the old file's mode and owner: a new
    file next to it (never following a link), synced, then renamed over it."""
    old = os.stat(path)
    tmp = f"{path}.numa-pin.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchown(fd, old.st_uid, old.st_gid)
            os.fchmod(fd, old.st_mode & 0o7777)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def decide(config_path: str, container_id: str, env: Mapping[str, str], say: Callable[[str], None] = _print) -> int:
    """Run the precreate decision on ``config_path`` for runc's ``container_id``, writing the
    edited config back when it changed. Returns the hook's exit code (0: admitted or nothing
    asked; otherwise its line went to ``say`` and nothing is held)."""
    from numa_pin.base.boundedio import read_regular_file
    from numa_pin.hook.oci import MAX_DOCUMENT_BYTES, load_object
    from numa_pin.hook.precreate import container_id_from_cgroups_path

    try:
        original = load_object(read_regular_file(config_path, MAX_DOCUMENT_BYTES), config_path)
    except (OSError, ValueError) as exc:  # HookInputError and UnsafeInput are ValueErrors
        from numa_pin.base.text import one_line

        kind = getattr(exc, "kind", None)  # a HookInputError names the file; the others may not
        why = str(exc) if kind else f"{config_path}: {exc}"
        say(one_line(f"numa-pin: error {container_id}: {kind or 'HookInputError'}: {why}"))
        return 1
    asked = with_env_annotations(original)
    code, out = _hook("precreate", json.dumps(asked).encode(), env, say)
    if code != 0:
        return code
    edited = load_object(out, "precreate output")
    if edited == asked:
        return 0
    linux = original.get("linux")
    keyed = container_id_from_cgroups_path(linux.get("cgroupsPath") if isinstance(linux, dict) else None)
    if keyed != container_id:
        if keyed is not None:
            release(keyed, env, say)
        say(f"numa-pin: error {container_id}: HookInputError: {config_path}: linux.cgroupsPath names "
               f"container {keyed}, not runc's {container_id}; numa-pin could not release its grant by runc's id")
        return 1
    try:
        write_atomically(config_path, json.dumps(edited).encode())
    except OSError as exc:
        release(container_id, env, say)
        say(f"numa-pin: error {container_id}: cannot write {config_path}: {exc}")
        return 4
    return 0


def release(container_id: str, env: Mapping[str, str], say: Callable[[str], None] = _print) -> int:
    """Release the grant of ``container_id`` (the hook's poststop; nothing to release is fine)."""
    state = json.dumps({"ociVersion": "1.0.2", "id": container_id, "status": "stopped", "bundle": "/"})
    return _hook("poststop", state.encode(), env, say)[0]


def log_errors(path: str, log_format: str, lines: Sequence[str]) -> None:
    """Append ``lines`` to runc's ``--log`` file as runc's own errors (logrus ``json`` or
    ``text``): the shim takes the last error there as the runtime's error, and Docker shows it
    in ``docker run``'s. A log that cannot be written is skipped (the lines are on stderr)."""
    from time import gmtime, strftime

    now = strftime("%Y-%m-%dT%H:%M:%SZ", gmtime())
    if log_format == "json":
        text = "".join(json.dumps({"level": "error", "msg": line, "time": now}) + "\n" for line in lines)
    else:
        text = "".join(f"time={json.dumps(now)} level=error msg={json.dumps(line)}\n" for line in lines)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError:
        return
    try:
        os.write(fd, text.encode())
    except OSError:
        pass
    finally:
        os.close(fd)


def _runc(runc: str, args: Sequence[str]) -> int:
    return subprocess.run([runc, *args], check=False).returncode


def runc_knows(runc: str, global_args: Sequence[str], container_id: str) -> bool:
    """Whether ``runc state <id>`` (with the same global flags) finds the container."""
    done = subprocess.run([runc, *global_args, "state", container_id],
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return done.returncode == 0


def create(runc: str, args: Sequence[str], invocation: Invocation, env: Mapping[str, str]) -> int:
    """Decide, then runc's create with ``args`` (the bundle: ``--bundle``, else the working
    directory); a refusal also goes to runc's log, and a failed create releases what runc left
    unknown."""
    cid = str(invocation.container_id)
    said: list[str] = []

    def say(line: str) -> None:
        _print(line)
        said.append(line)

    code = decide(os.path.join(invocation.bundle or ".", CONFIG_NAME), cid, env, say)
    if code != 0:
        if invocation.log:
            log_errors(invocation.log, invocation.log_format, said)
        return code
    rc = _runc(runc, args)
    if rc != 0 and not runc_knows(runc, invocation.global_args, cid):
        release(cid, env)
    return rc


def delete(runc: str, args: Sequence[str], invocation: Invocation, env: Mapping[str, str]) -> int:
    """runc's delete with ``args``, then the release once runc no longer knows the container.
    runc's exit code is the answer (a grant that could not be released says so on stderr and
    liveness drops it later)."""
    cid = str(invocation.container_id)
    rc = _runc(runc, args)
    if rc == 0 or not runc_knows(runc, invocation.global_args, cid):
        release(cid, env)
    return rc


__all__ = ["ANNOTATION_PREFIX", "CONFIG_NAME", "ENV_PREFIX", "create", "decide", "delete", "env_annotations",
           "known_keys", "log_errors", "release", "runc_knows", "with_env_annotations", "write_atomically"]
