"""numa-pin: Kubernetes Topology Manager NUMA alignment for OCI containers and plain processes.

Keep this module tiny: the OCI hook imports the package on every container start.
"""

__version__ = "0.1.0"
