"""What users run on their own runs, behind ``scripts/``: run comparison, decoding tuning, their measures.

Each module is one command's logic (``main(argv)`` returns its report); ``scripts/<name>.py`` only calls it.
These modules use the core package (``nmt.inference.engine``, ``nmt.train.trainer``, ``nmt.data``, ...); the core never
imports them. They write reports; the measuring tools (speed, peers) are ``nmt_tools``, beside the package.
"""
