"""nmt: an attention-based GRU encoder-decoder NMT trainer.

Data flows one way: ``nmt.data`` (corpora, subwords, batches) -> ``nmt.model`` (encoder, decoder,
``nmt.attention`` plug-in) -> ``nmt.training`` (loop, validation, checkpoints) and ``nmt.search``
(greedy / beam) -> ``nmt.translation`` (files in, translations out).
"""

__version__ = "0.1.0"
