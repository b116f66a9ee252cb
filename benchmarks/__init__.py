"""Benchmarks for ``statemachine``: the engine side by side with what it replaces.

Run everything with ``python -m benchmarks`` from the repository root (``--help`` for
options). Each measurement lives in its own module and exposes ``run(...) -> dict``;
``benchmarks.__main__`` runs them in one process and prints the ratios. Results are
recorded in ``benchmarks/README.md``; tests only check the structure, never timings.
"""
