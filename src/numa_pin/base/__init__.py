"""Rank 0: what every layer uses. Frozen records, names, CPU lists, quantities, PCI addresses,
one-line escaping and digests; bounded reads, safe files and the admission's deadline.

This package imports nothing.
"""
