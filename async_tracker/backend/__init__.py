"""Backends: one module each. ``memory`` ships for tests and examples."""
