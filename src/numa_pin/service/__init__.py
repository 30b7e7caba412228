"""The node service: one admission, release or adoption as one ledger transaction.

This package imports nothing.
"""
