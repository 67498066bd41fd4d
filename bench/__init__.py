"""Benchmarks: ``python -m bench.overhead`` and ``python -m bench.sim_throughput``.

They print ratios against a reference measured in the same run; see ``bench/README.md``.
"""
