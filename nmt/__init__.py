"""nmt: attention-based GRU encoder-decoder translation models to train, compare, inspect and use
(``from nmt import Translator``).
"""

from typing import TYPE_CHECKING, Any

from nmt.common.version import __version__

if TYPE_CHECKING:
    from nmt.inference.engine import Translator

__all__ = ["Translator", "__version__"]


def __getattr__(name: str) -> Any:
    """``Translator`` on first use: a program that needs no model (reproduce.py's chain) starts without PyTorch."""
    if name == "Translator":
        from nmt.inference.engine import Translator

        return Translator
    raise AttributeError(f"module 'nmt' has no attribute {name!r}")
