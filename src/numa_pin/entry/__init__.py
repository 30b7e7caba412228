"""The hook commands a runtime starts: ``numa-pin-hook`` (:mod:`numa_pin.entry.hook`) and
``numa-pin-runc`` (:mod:`numa_pin.entry.runc`), over the invocation in :mod:`numa_pin.hook`."""
