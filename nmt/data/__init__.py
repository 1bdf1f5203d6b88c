"""nmt.data: parallel corpora in, padded token-budget batches out, at any corpus size.

The path of the data, one module per arrow:

    fetch.py      a named file into the cache from a mirror or the network, sha256-verified
    corpora.py    corpus registry (``multi30k``, ``files``; ``tatoeba.py`` registers ``tatoeba``):
                  which files a split is
    text.py       stream lines and aligned pairs (UTF-8 and line counts checked), clean the
                  training pairs (``PairFilter``)
    monolingual.py  registered monolingual text (``multi30k_task2``), deduplicated, for back-translation
    mixture.py    ``data.mixture``: training sources with weights and tags, resolved to files
    tokenizer.py  SentencePiece subwords with fixed ids PAD=0, UNK=1, BOS=2, EOS=3; cached
    encoded.py    ``EncodedSplit``: ids as flat token arrays + offsets (``RaggedIds``), written to
                  ``.npy`` files in chunks and memory-mapped back, shared by every process
    prepare.py    ``prepare_data(cfg)``: the above in order, streamed, with every slow result cached
    batching.py   ``build_loader``: token-bucket batches (DDP-aware, resumable, planned with numpy,
                  each source seen ``weight`` times an epoch)
                  -> ``Batch``

Shapes (batch-first): B pairs, S source length incl. EOS, T target length incl. BOS/EOS; N pairs
of a split.

Memory: nothing holds the training split's text; its ids are mapped from disk, so a process (and
every DDP rank on a machine, together) holds one page-cache copy of them, whatever the corpus size.

What it does not do: anything with models, losses or metrics.
"""

from nmt.data import tatoeba as _tatoeba  # noqa: F401  (registers data.corpus=tatoeba)
from nmt.data.batching import (
    Batch,
    EncodedSplit,
    TokenBucketSampler,
    build_loader,
    collate_batch,
)
from nmt.data.corpora import CORPORA, register_corpus
from nmt.data.encoded import RaggedIds
from nmt.data.errors import DataError
from nmt.data.prepare import PreparedData, prepare_data
from nmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer, TokenizerSettings, train_tokenizer

__all__ = [
    "BOS_ID",
    "CORPORA",
    "EOS_ID",
    "PAD_ID",
    "UNK_ID",
    "Batch",
    "DataError",
    "EncodedSplit",
    "PreparedData",
    "RaggedIds",
    "Tokenizer",
    "TokenizerSettings",
    "TokenBucketSampler",
    "build_loader",
    "collate_batch",
    "prepare_data",
    "register_corpus",
    "train_tokenizer",
]
