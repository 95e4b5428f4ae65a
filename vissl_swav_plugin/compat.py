"""Compatibility shims for VISSL 0.1.6 on today's stack (placeholder, filled in below)."""


def apply_all():
    pass
