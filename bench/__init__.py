"""Benchmarks (run by hand, not in CI): `python -m bench.<name> --help`."""
