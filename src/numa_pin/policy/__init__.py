"""Topology Manager policies: kubelet's hint merge, one policy per module. Pure code.

Importing this package loads nothing: :mod:`numa_pin.policy.bitmask` and
:mod:`numa_pin.policy.hint` are the value types every provider uses, and they must not drag the
merge engine along. The policies and their registry are :mod:`numa_pin.policy.registry`
(``get_policy``, ``merge_hints``); the merge engine is :mod:`numa_pin.policy.merge`;
:mod:`numa_pin.policy.reference` is the brute-force oracle the tests compare against.
"""
