"""nmt.data: parallel corpora in, padded token-budget batches out.

The path of the data, one module per arrow:

    corpora.py    corpus registry (``multi30k``, ``files``); fetch from a mirror or the network
                  into the cache, sha256-verify, read (UTF-8, line counts), clean the train split
    tokenizer.py  SentencePiece subwords with fixed ids PAD=0, UNK=1, BOS=2, EOS=3; cached
    prepare.py    ``prepare_data(cfg)``: the above in order, with the encoded splits cached
    batching.py   ``build_loader``: token-bucket batches (DDP-aware, resumable) -> ``Batch``

Shapes (batch-first): B pairs, S source length incl. EOS, T target length incl. BOS/EOS.

What it does not do: anything with models, losses or metrics.
"""

from nmt.data.batching import (
    Batch,
    EncodedSplit,
    TokenBucketSampler,
    build_loader,
    collate_batch,
)
from nmt.data.corpora import CORPORA, DataError, register_corpus
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
    "Tokenizer",
    "TokenizerSettings",
    "TokenBucketSampler",
    "build_loader",
    "collate_batch",
    "prepare_data",
    "register_corpus",
    "train_tokenizer",
]
