"""nmt: an attention-based GRU encoder-decoder NMT trainer.

Data flows one way: ``nmt.data`` (corpora, subwords, batches) -> ``nmt.model`` (encoder, decoder,
``nmt.attention`` plug-in) -> ``nmt.training`` (loop, validation, checkpoints) and ``nmt.search``
(greedy / sampling / beam) -> ``nmt.translator`` (the inference engine: ``Translator``) ->
``nmt.translate_job`` (files and stdin), ``nmt.server`` (HTTP) and ``nmt.backtranslation`` (monolingual
text into synthetic pairs); ``nmt.analysis`` holds what users run on their own runs (``scripts/compare_runs.py``,
``scripts/tune_decoding.py``); the measuring tools are in ``nmt_tools/``, beside the package.

``from nmt import Translator`` loads a trained run for use from Python (see ``nmt.translator``).
"""

from nmt.translator import Translator
from nmt.version import __version__

__all__ = ["Translator", "__version__"]
