"""The tools that measure the product: speed, scale, load, peers, time to BLEU.

They sit beside the installed package ``nmt`` and use its public API; nothing in ``nmt`` imports them.
Their entry points are ``scripts/benchmark.py`` (one mode per question) and ``scripts/peer_compare.py``;
the figures they write are explained in docs/development/benchmarking.md.
"""
