"""The `Tokenizer` interface shared by every drafter and verifier vocabulary.

A tokenizer here is byte-exact: every id stands for a fixed byte string
(`token_bytes`), the text of a token sequence is the concatenation of those bytes, and
`decode(encode(text)) == text` for every string. Cross-vocabulary verification
(`vocab_map.py`) relies on this: two vocabularies are compared token by token through
their bytes, never through model-specific string conventions.

Tokenizers are saved as one JSON file, ``{"kind": ..., "name": ..., ...}``;
`specjax.tokenizers.loading.load_tokenizer` dispatches on ``kind`` (this module does not
import the implementations: they import it).
"""

from __future__ import annotations

import abc
import hashlib
import json
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from specjax.atomic import atomic_write_text

#: Bumped when the JSON layout written by `Tokenizer.save` changes incompatibly.
FORMAT_VERSION = 1


class Tokenizer(abc.ABC):
    """A byte-exact tokenizer with a contiguous id space ``[0, vocab_size)``.

    Attributes:
        name: A human-readable label (not part of the fingerprint).
        kind: The ``kind`` tag written to JSON; set by each subclass.
    """

    kind: str = ""
    name: str

    # ----------------------------------------------------------------- abstract API
    @property
    @abc.abstractmethod
    def vocab_size(self) -> int:
        """Number of ids, special tokens included; ids are ``0 .. vocab_size-1``."""

    @property
    @abc.abstractmethod
    def special_tokens(self) -> dict[str, int]:
        """Special-token text -> id. Special tokens are matched verbatim in `encode`."""

    @abc.abstractmethod
    def encode_bytes(self, data: bytes) -> list[int]:
        """Tokenises raw bytes, which need not be valid UTF-8 on their own.

        Used to re-tokenise the bytes of one token of another vocabulary (which may
        end in the middle of a multi-byte character). For valid UTF-8 it agrees with
        `encode`.

        Args:
            data: The bytes to tokenise.

        Returns:
            Ids whose `token_bytes` concatenate to exactly ``data``.
        """

    @abc.abstractmethod
    def token_bytes(self, token_id: int) -> bytes:
        """The exact bytes id ``token_id`` stands for (special tokens: their UTF-8 text).

        Raises:
            ValueError: If the id is outside ``[0, vocab_size)``.
        """

    @abc.abstractmethod
    def _fingerprint_payload(self) -> dict[str, Any]:
        """Everything that determines the id <-> bytes mapping and the segmentation."""

    @abc.abstractmethod
    def to_json(self) -> dict[str, Any]:
        """The JSON object `save` writes (must contain ``kind`` and ``name``)."""

    @classmethod
    @abc.abstractmethod
    def from_json(cls, obj: dict[str, Any], source: str = "<json>") -> Tokenizer:
        """Rebuilds a tokenizer from `to_json` output; ``source`` names it in errors."""

    # --------------------------------------------------------------- derived API
    def encode(self, text: str) -> list[int]:
        """Tokenises text; special-token strings in it become their single ids.

        Args:
            text: Any Python string.

        Returns:
            Token ids; ``decode(encode(text)) == text`` exactly.
        """
        return self.encode_bytes(text.encode("utf-8"))

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """Concatenation of the tokens' bytes (exact, even mid-character)."""
        return b"".join(self.token_bytes(int(i)) for i in ids)

    def decode(self, ids: Iterable[int]) -> str:
        """Decodes ids to text.

        Args:
            ids: Token ids (any iterable of ints, e.g. a 1-D numpy array).

        Returns:
            The text. Bytes that are not valid UTF-8 (a sequence cut mid-character)
            become U+FFFD, so the result is always a string; use `decode_bytes` for
            exactness in that case.
        """
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def fingerprint(self) -> str:
        """Sha256 (hex) of the vocabulary and merges.

        Two tokenizers belong to the same tokenizer group iff their fingerprints are
        equal; the name is deliberately excluded.
        """
        cached = getattr(self, "_fingerprint_cache", None)
        if cached is None:
            payload = json.dumps(
                self._fingerprint_payload(),
                sort_keys=True,
                ensure_ascii=True,
                separators=(",", ":"),
            )
            cached = hashlib.sha256(payload.encode("ascii")).hexdigest()
            self._fingerprint_cache = cached
        return cached

    def all_token_bytes(self) -> list[bytes]:
        """``[token_bytes(i) for i in range(vocab_size)]``."""
        return [self.token_bytes(i) for i in range(self.vocab_size)]

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes the tokenizer as a single JSON file (atomically)."""
        path = Path(path)
        obj = {"format_version": FORMAT_VERSION, **self.to_json()}
        atomic_write_text(path, json.dumps(obj, ensure_ascii=False))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """Loads a tokenizer of this class saved by `save` (`load_tokenizer`: any kind)."""
        obj = read_tokenizer_json(path)
        kind = obj.get("kind")
        if kind != cls.kind:
            raise ValueError(
                f"{path}: holds a tokenizer of kind {kind!r}, not a "
                f"{cls.__name__} (kind {cls.kind!r})"
            )
        check_format_version(obj, path)
        return cls.from_json(obj, source=str(path))

    def _check_id(self, token_id: int) -> int:
        token_id = int(token_id)
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(
                f"token id {token_id} out of range [0, {self.vocab_size}) "
                f"for tokenizer {self.name!r}"
            )
        return token_id

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(name={self.name!r}, "
            f"vocab_size={self.vocab_size}, fingerprint={self.fingerprint()[:12]})"
        )


def split_special(data: bytes, specials: Sequence[bytes]) -> list[tuple[bytes, bool]]:
    """Splits ``data`` into (piece, is_special) runs, matching specials verbatim.

    Longest special first, so that e.g. ``</think>`` is not read as ``<`` + ... when a
    shorter special is a prefix of a longer one.

    Args:
        data: Bytes to split.
        specials: Special-token byte strings (non-empty).

    Returns:
        Non-empty pieces in order; their concatenation is ``data``.
    """
    if not specials or not data:
        return [(data, False)] if data else []
    pattern = re.compile(
        b"|".join(re.escape(s) for s in sorted(set(specials), key=len, reverse=True))
    )
    out: list[tuple[bytes, bool]] = []
    pos = 0
    for m in pattern.finditer(data):
        if m.start() > pos:
            out.append((data[pos : m.start()], False))
        out.append((m.group(0), True))
        pos = m.end()
    if pos < len(data):
        out.append((data[pos:], False))
    return out


def read_tokenizer_json(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON object of a tokenizer file, for `load_tokenizer` and `Tokenizer.load`.

    A raw Hugging Face ``tokenizer.json`` (no ``kind``, a ``model`` object) is returned as
    ``{"kind": "bpe", "name": <file stem>, "tokenizer": <it>}``.

    Raises:
        ValueError: One line naming the problem: missing file, not JSON, not an object.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"tokenizer file not found: {path}")
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a valid tokenizer JSON file ({e})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: tokenizer JSON must be an object, got {type(obj).__name__}")
    if "kind" not in obj and isinstance(obj.get("model"), dict):
        # A bare HF tokenizer.json; BPETokenizer validates that it is byte-level.
        obj = {"kind": "bpe", "name": path.stem, "tokenizer": obj}
    return obj


def check_format_version(obj: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """ValueError (one line) unless ``obj`` is in the layout this code reads."""
    version = obj.get("format_version", FORMAT_VERSION)
    if version != FORMAT_VERSION:
        raise ValueError(
            f"{path}: tokenizer format_version {version} unsupported (this code reads "
            f"{FORMAT_VERSION})"
        )
