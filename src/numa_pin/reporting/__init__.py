"""What admissions leave behind besides the ledger: reason files and syslog lines
(``report.py``), and the counts the metrics export (``tally.py``).

This package imports nothing.
"""
