"""Translation with an exported model (``python export.py``) on onnxruntime, numpy and SentencePiece alone: no PyTorch.

    from nmt_runtime import Translator
    translator = Translator("exports/de-en")
    [result] = translator.translate(["Ein Hund läuft durch den Schnee."], beam_size=5)
    result.text, result.score, result.nbest

``python -m nmt_runtime FOLDER < input > output`` does the same from a shell. Greedy and beam search, the
length penalty, the length limits and the n-best lists are the engine's (``nmt.inference.engine``).
"""

from nmt_runtime.folder import ExportFolderError
from nmt_runtime.translator import SearchOptions, Translation, Translator

__all__ = ["ExportFolderError", "SearchOptions", "Translation", "Translator"]
