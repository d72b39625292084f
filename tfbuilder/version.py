"""The package's version (bottom layer: imports nothing)."""

__version__ = "0.1.0"
