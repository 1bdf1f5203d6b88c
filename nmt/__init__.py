"""nmt: attention-based GRU encoder-decoder translation models to train, compare, inspect and use.

``from nmt import Translator`` loads a trained run for use from Python. The layout is described in
docs/architecture.md.
"""

from nmt.common.version import __version__
from nmt.inference.engine import Translator

__all__ = ["Translator", "__version__"]
