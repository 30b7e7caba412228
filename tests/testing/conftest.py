"""Keep pytest out of the sysfs snapshots: their node/cpu links form cycles, as in sysfs."""

collect_ignore = ["snapshots"]
