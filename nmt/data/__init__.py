"""Parallel corpora in, padded token-budget batches out, at any corpus size (ids memory-mapped from disk)."""

from nmt.data import tatoeba as _tatoeba  # noqa: F401  (registers data.corpus=tatoeba)
from nmt.data.batching import Batch, EncodedSplit, TokenBucketSampler, build_loader, collate_batch
from nmt.data.corpora import CORPORA, register_corpus
from nmt.data.encoded import RaggedIds
from nmt.data.errors import DataError
from nmt.data.prepare import PreparedData, prepare_data
from nmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer, TokenizerSettings, train_tokenizer

__all__ = [
    "BOS_ID", "CORPORA", "EOS_ID", "PAD_ID", "UNK_ID", "Batch", "DataError", "EncodedSplit", "PreparedData",
    "RaggedIds", "Tokenizer", "TokenizerSettings", "TokenBucketSampler", "build_loader", "collate_batch",
    "prepare_data", "register_corpus", "train_tokenizer",
]
