"""nmt: an attention-based GRU encoder-decoder NMT trainer.

Data flows one way: ``nmt.data`` (corpora, subwords, batches) -> ``nmt.model`` (encoder, decoder,
``nmt.attention`` plug-in) -> ``nmt.training`` (loop, validation, checkpoints) and ``nmt.search``
(greedy / beam) -> ``nmt.translator`` (the inference engine: ``Translator``) -> ``nmt.translation``
(files and stdin) and ``nmt.server`` (HTTP).

``from nmt import Translator`` loads a trained run for use from Python (see ``nmt.translator``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["Translator", "__version__"]

if TYPE_CHECKING:
    from nmt.translator import Translator


def __getattr__(name: str) -> Any:
    # Imported on first use: ``import nmt`` (and ``nmt.__version__``, read by checkpoints) stays free of torch.
    if name == "Translator":
        from nmt.translator import Translator

        return Translator
    raise AttributeError(f"module 'nmt' has no attribute {name!r}")
