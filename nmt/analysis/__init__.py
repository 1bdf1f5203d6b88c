"""The analysis tools behind ``scripts/``: run comparison, decoding tuning, benchmarks, the JoeyNMT comparison.

Each module is one command's logic (``main(argv)`` returns its report); ``scripts/<name>.py`` only calls it.
These modules use the core package (``nmt.translator``, ``nmt.training``, ``nmt.data``, ...); the core never
imports them. They write reports and assert nothing about speed: timings never go into the test suite.
"""
