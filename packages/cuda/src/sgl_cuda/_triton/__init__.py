"""Triton kernels. Triton ships no type hints, so it is confined to this package."""
