"""Benchmark results: the file each benchmark writes, with its provenance, and the page made from it."""

from .results import RESULTS_FORMAT, BenchmarkResult, provenance, read_result, write_result

__all__ = ["RESULTS_FORMAT", "BenchmarkResult", "provenance", "read_result", "write_result"]
