"""nmt: attention-based GRU encoder-decoder translation models to train, compare, inspect and use
(``from nmt import Translator``).
"""

from nmt.common.version import __version__
from nmt.inference.engine import Translator

__all__ = ["Translator", "__version__"]
