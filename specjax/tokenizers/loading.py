"""`load_tokenizer`: any tokenizer saved by `Tokenizer.save`, by its ``kind``.

Its own module because it needs every implementation, and the implementations import
`specjax.tokenizers.base`.
"""

from __future__ import annotations

import os

from specjax.tokenizers.base import Tokenizer, check_format_version, read_tokenizer_json
from specjax.tokenizers.bpe import BPETokenizer
from specjax.tokenizers.byte import ByteTokenizer
from specjax.tokenizers.hf import HFTokenizer

__all__ = ["KINDS", "load_tokenizer"]

#: ``kind`` (as written to JSON) -> the class that reads it.
KINDS: dict[str, type[Tokenizer]] = {
    ByteTokenizer.kind: ByteTokenizer,
    BPETokenizer.kind: BPETokenizer,
    HFTokenizer.kind: HFTokenizer,
}


def load_tokenizer(path: str | os.PathLike[str]) -> Tokenizer:
    """Loads any tokenizer saved by `Tokenizer.save`, dispatching on its ``kind``.

    A raw Hugging Face ``tokenizer.json`` of a byte-level BPE model (e.g. GPT-2's) is
    accepted too and wrapped as a `BPETokenizer`.

    Args:
        path: A JSON file.

    Returns:
        The tokenizer.

    Raises:
        ValueError: One line naming the problem: missing file, not JSON, unknown kind.
    """
    obj = read_tokenizer_json(path)
    kind = obj.get("kind")
    if kind not in KINDS:
        raise ValueError(
            f"{path}: unknown tokenizer kind {kind!r} (expected one of {sorted(KINDS)})"
        )
    check_format_version(obj, path)
    return KINDS[kind].from_json(obj, source=str(path))
