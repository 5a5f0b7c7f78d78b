"""Benchmark suites run by ``jobs/benchmark.py``. Each suite module exposes
``run(options: dict) -> dict`` that prints a table and returns the JSON figures."""
