"""Benchmarks and reports: scripts that measure and write markdown under docs/."""
