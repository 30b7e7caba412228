"""The warm agent (``numa-pin serve``): hook admissions without the interpreter's import cost.

* :mod:`numa_pin.agent.protocol`: the wire format both sides speak (pure);
* :mod:`numa_pin.agent.client`: the hook's side, import-light, never raises;
* :mod:`numa_pin.agent.preload`: what the server imports once, and how it notices upgrades;
* :mod:`numa_pin.agent.server`: the listener that forks one child per admission.

This package imports nothing: the hook loads only the client and the protocol.
"""
