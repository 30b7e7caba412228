"""NRI's protobuf messages, made at run time from the checked-in descriptors.

``descriptors.binpb`` is the ``FileDescriptorSet`` of ``third_party/nri``'s ``api.proto`` (NRI's
plugin API, vendored) and ``ttrpc.proto`` (the RPC envelope), compiled by ``make nri-descriptors``;
``tests/nri/test_messages.py`` compiles the .proto files again and compares. Message classes are
built from it through ``descriptor_pool`` and ``message_factory``, which Debian 12's
``python3-protobuf`` 3.21 and today's protobuf both have, so no generated ``_pb2`` code has to
match the runtime's version. Nothing on the hook's path imports this module (protobuf costs tens
of milliseconds to import).
"""

from __future__ import annotations

import os
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message, message_factory

from numa_pin.base.boundedio import read_regular_file
from numa_pin.errors import ConfigError

#: the descriptor set next to this module
DESCRIPTORS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "descriptors.binpb")
MAX_DESCRIPTOR_BYTES = 1 << 20
#: NRI's protobuf package, and the ttrpc services a plugin serves and calls
API_PACKAGE = "nri.pkg.api.v1alpha1"
PLUGIN_SERVICE = API_PACKAGE + ".Plugin"
RUNTIME_SERVICE = API_PACKAGE + ".Runtime"


class Messages:
    """The message classes of one descriptor set: ``messages.api("CreateContainerRequest")``,
    ``messages.ttrpc("Request")``."""

    def __init__(self, data: bytes) -> None:
        fds = descriptor_pb2.FileDescriptorSet.FromString(data)
        self.pool = descriptor_pool.DescriptorPool()
        for proto in fds.file:
            self.pool.Add(proto)
        self._classes: dict[str, Any] = {}

    def get(self, full_name: str) -> Any:
        """The message class of ``full_name`` (made once)."""
        cls = self._classes.get(full_name)
        if cls is None:
            desc = self.pool.FindMessageTypeByName(full_name)
            make = getattr(message_factory, "GetMessageClass", None)  # protobuf >= 4.21
            cls = make(desc) if make is not None else message_factory.MessageFactory(self.pool).GetPrototype(desc)
            self._classes[full_name] = cls
        return cls

    def api(self, name: str) -> Any:
        return self.get(f"{API_PACKAGE}.{name}")

    def ttrpc(self, name: str) -> Any:
        return self.get(f"ttrpc.{name}")

    def event(self, name: str) -> int:
        """The number of NRI's ``Event`` ``name`` (``CREATE_CONTAINER`` -> 4)."""
        return self.pool.FindEnumTypeByName(f"{API_PACKAGE}.Event").values_by_name[name].number


_LOADED: Messages | None = None


def load(path: str = DESCRIPTORS) -> Messages:
    """The messages of the descriptor set at ``path`` (the package's own, read once).

    Raises ConfigError when the file is missing, too large or not a descriptor set.
    """
    global _LOADED
    if path == DESCRIPTORS and _LOADED is not None:
        return _LOADED
    try:
        messages = Messages(read_regular_file(path, MAX_DESCRIPTOR_BYTES))
    except (OSError, ValueError, TypeError, message.Error) as exc:  # DecodeError is a message.Error
        raise ConfigError(f"{path}: not NRI's protobuf descriptors ({exc})") from exc
    if path == DESCRIPTORS:
        _LOADED = messages
    return messages


def event_mask(messages: Messages, names: tuple[str, ...]) -> int:
    """NRI's subscription mask: bit ``event - 1`` for each event."""
    mask = 0
    for name in names:
        mask |= 1 << (messages.event(name) - 1)
    return mask


__all__ = ["API_PACKAGE", "DESCRIPTORS", "PLUGIN_SERVICE", "RUNTIME_SERVICE", "Messages", "event_mask", "load"]
