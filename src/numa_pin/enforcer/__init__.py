"""The enforcement edge: the only part of numa-pin that changes the running system.

* :mod:`~numa_pin.enforcer.cgroups` find a process's cgroup (v1, v2, hybrid)
* :mod:`~numa_pin.enforcer.cpuset`  write and verify ``cpuset.mems`` / ``cpuset.cpus``
* :mod:`~numa_pin.enforcer.pool`    the shared CPU pool and resizing shared containers
* :mod:`~numa_pin.enforcer.netdev`  move SR-IOV VFs into a container netns and back
* :mod:`~numa_pin.enforcer.gpu`     NVIDIA device cgroup grants
* :mod:`~numa_pin.enforcer.undo`    the undo log a failed admission is rolled back with
* :mod:`~numa_pin.enforcer.procgroup` cgroups of numa-pin's own for ``numa-pin run``

Every root (``proc_root``, ``cgroup_root``, ``sysfs_root``) is a parameter. pyroute2 is
imported only inside the netdev functions. Import the submodules directly
(``from numa_pin.enforcer.cpuset import apply_cpuset``): this package imports nothing itself,
so the hook pays only for the pieces a container needs.
"""
