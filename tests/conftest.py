"""Suite-wide settings.

Hypothesis runs deterministically (derandomized, no example database) and without per-example
deadlines, so a busy CI machine cannot turn a slow example into a failure. Tests that need more
examples or other health checks set them explicitly on top of this profile.
"""

from hypothesis import HealthCheck, settings

settings.register_profile(
    "numa-pin",
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("numa-pin")
