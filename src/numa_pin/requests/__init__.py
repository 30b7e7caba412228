"""What a container asks for, read from its annotations, limits and environment: the
:class:`~numa_pin.requests.request.ContainerRequest` every path builds before anything is decided
(pure; :mod:`numa_pin.admission` decides on it)."""
