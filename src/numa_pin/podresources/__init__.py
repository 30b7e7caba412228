"""kubelet's pod-resources API (``docs/kubernetes.md``).

* :mod:`numa_pin.podresources.client`: ``List`` and ``GetAllocatableResources`` over kubelet's
  socket (grpcio), bounded, with messages from ``descriptors.binpb``.
"""
