"""numa-pin as an NRI plugin (``numa-pin serve --nri``; ``docs/nri.md``).

* :mod:`numa_pin.nri.wire`: ttrpc messages in NRI's multiplexed frames (the pure decoder and a socket);
* :mod:`numa_pin.nri.messages`: NRI's protobuf messages, made at run time from ``descriptors.binpb``;
* :mod:`numa_pin.nri.convert`: NRI's container as the hook's ``config.json``; a grant as an adjustment;
* :mod:`numa_pin.nri.plugin`: registration, synchronisation and the answers, through the node service.
"""
