"""Tokenizers: the byte-exact `Tokenizer` interface, byte and byte-level BPE
tokenizers, and the vocabulary maps used by cross-vocabulary verification."""

from specjax.tokenizers.base import Tokenizer
from specjax.tokenizers.bpe import BPETokenizer, train_bpe
from specjax.tokenizers.byte import ByteTokenizer
from specjax.tokenizers.loading import load_tokenizer
from specjax.tokenizers.vocab_map import intersection_map, retokenization_table, same_group

__all__ = [
    "BPETokenizer",
    "ByteTokenizer",
    "Tokenizer",
    "intersection_map",
    "load_tokenizer",
    "retokenization_table",
    "same_group",
    "train_bpe",
]
