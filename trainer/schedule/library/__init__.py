"""Schedules that are one file each: a builder and its ``register`` call, nothing else.

Every module of this package is imported when the registry is (registry.py, at its end, after
the schedules declared there), in name order, so a schedule added here is a built-in everywhere
the registry's names are read: ``build``, the runtime, the simulator, the API, the CLI and the
dashboard's form. Modules here import only what the registry may (no torch, no numpy).
"""
