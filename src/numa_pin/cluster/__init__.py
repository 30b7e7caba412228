"""Where numa-pin meets Kubernetes: kubelet's files, the API server, NodeResourceTopology.

This package imports nothing.
"""
