"""Byte-level BPE over Hugging Face `tokenizers`, byte-exact in both directions.

The pipeline is GPT-2's: no normalizer (a normalizer would make round trips lossy),
the ByteLevel pre-tokenizer (``add_prefix_space=False`` so no space is invented,
``use_regex=True`` for the GPT-2 word split) and a BPE model over the 256-symbol
byte-level alphabet, so every byte string has a tokenisation. Special tokens are HF
added tokens matched verbatim (``normalized=False``, no strip), so they encode as one id
and decode back unchanged.

Decoding never goes through the HF decoder: `token_bytes` is computed once from the
vocabulary and decoding is a byte concatenation, which is exact by construction.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any

import tokenizers
from tokenizers import AddedToken, decoders, models, pre_tokenizers, trainers

from specjax.tokenizers.base import Tokenizer


@lru_cache(maxsize=1)
def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable-character map (the byte-level alphabet).

    Printable Latin-1 bytes map to themselves; the other 68 bytes are shifted to
    code points 256.. so that no symbol is whitespace or a control character.
    """
    keep = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    table: dict[int, str] = {}
    extra = 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


@lru_cache(maxsize=1)
def unicode_to_byte() -> dict[str, int]:
    """Inverse of `byte_to_unicode`."""
    return {c: b for b, c in byte_to_unicode().items()}


# Lone surrogates produced by decode(..., "surrogateescape") for undecodable bytes.
_ESCAPED_RUN = re.compile("[\udc80-\udcff]+")


class BPETokenizer(Tokenizer):
    """A byte-level BPE tokenizer wrapping a `tokenizers.Tokenizer`.

    Args:
        hf: The HF tokenizer. Must be byte-level (every vocabulary entry spelled in
            the byte-level alphabet), have no normalizer, contiguous ids, and added
            tokens that do not strip whitespace.
        name: Label for logs and reports.

    Raises:
        ValueError: If ``hf`` cannot round-trip text exactly.
    """

    kind = "bpe"

    def __init__(self, hf: tokenizers.Tokenizer, name: str = "bpe") -> None:
        self.name = name
        self._hf = hf
        spec = json.loads(hf.to_str())
        if spec.get("normalizer") is not None:
            raise ValueError(f"BPE tokenizer {name!r}: a normalizer breaks exact round trips")
        if (spec.get("model") or {}).get("type") != "BPE":
            raise ValueError(f"tokenizer {name!r}: model type is not BPE")
        self._spec = spec
        added = hf.get_added_tokens_decoder()
        for tok in added.values():
            if tok.lstrip or tok.rstrip or tok.normalized:
                raise ValueError(
                    f"BPE tokenizer {name!r}: added token {tok.content!r} strips whitespace "
                    "or is normalized, which breaks exact round trips"
                )
        self._specials = {tok.content: tid for tid, tok in added.items()}
        vocab = hf.get_vocab(with_added_tokens=True)
        size = hf.get_vocab_size(with_added_tokens=True)
        if sorted(vocab.values()) != list(range(size)):
            raise ValueError(f"BPE tokenizer {name!r}: ids are not contiguous 0..{size - 1}")
        to_byte = unicode_to_byte()
        table: list[bytes] = [b""] * size
        for token, tid in vocab.items():
            if tid in added:
                table[tid] = added[tid].content.encode("utf-8")
                continue
            try:
                table[tid] = bytes(to_byte[c] for c in token)
            except KeyError:
                raise ValueError(
                    f"BPE tokenizer {name!r}: token {token!r} (id {tid}) is not spelled "
                    "in the byte-level alphabet"
                ) from None
        self._bytes = table

    # ------------------------------------------------------------------ interface
    @property
    def vocab_size(self) -> int:
        return len(self._bytes)

    @property
    def special_tokens(self) -> dict[str, int]:
        return dict(self._specials)

    @property
    def hf(self) -> tokenizers.Tokenizer:
        """The wrapped HF tokenizer (read-only use, please)."""
        return self._hf

    def encode(self, text: str) -> list[int]:
        return self._hf.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Encodes many strings at once (HF's multi-threaded path)."""
        return [e.ids for e in self._hf.encode_batch(list(texts), add_special_tokens=False)]

    def encode_bytes(self, data: bytes) -> list[int]:
        """Tokenises raw bytes; agrees with `encode` on valid UTF-8.

        Valid UTF-8 runs go through `encode` (so special tokens and the GPT-2 word
        split apply). Each maximal run of undecodable bytes (a character cut by another
        vocabulary's token boundary) is treated as one pre-token: its bytes are mapped
        to the byte-level alphabet and merged by the BPE model directly. That choice is
        a convention — such bytes have no canonical tokenisation — but it is exact.
        """
        text = data.decode("utf-8", errors="surrogateescape")
        if not _ESCAPED_RUN.search(text):
            return self.encode(text)
        to_unicode = byte_to_unicode()
        out: list[int] = []
        pos = 0
        for m in _ESCAPED_RUN.finditer(text):
            if m.start() > pos:
                out.extend(self.encode(text[pos : m.start()]))
            raw = bytes(ord(c) - 0xDC00 for c in m.group(0))
            symbols = "".join(to_unicode[b] for b in raw)
            out.extend(t.id for t in self._hf.model.tokenize(symbols))
            pos = m.end()
        if pos < len(text):
            out.extend(self.encode(text[pos:]))
        return out

    def token_bytes(self, token_id: int) -> bytes:
        return self._bytes[self._check_id(token_id)]

    def all_token_bytes(self) -> list[bytes]:
        return list(self._bytes)

    def merges(self) -> list[tuple[str, str]]:
        """The merge list in priority order, spelled in the byte-level alphabet."""
        raw = self._spec["model"].get("merges", [])
        # Older tokenizers versions serialise a merge as "a b" rather than ["a", "b"].
        return [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in raw]

    def _fingerprint_payload(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "tokens": [b.hex() for b in self._bytes],
            "special_ids": sorted(self._specials.values()),
            "merges": [list(m) for m in self.merges()],
            "pre_tokenizer": self._spec.get("pre_tokenizer"),
        }

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "tokenizer": self._spec}

    @classmethod
    def from_json(cls, obj: dict[str, Any], source: str = "<json>") -> BPETokenizer:
        spec = obj.get("tokenizer")
        if not isinstance(spec, dict):
            raise ValueError(f"{source}: BPE tokenizer JSON lacks a 'tokenizer' object")
        try:
            hf = tokenizers.Tokenizer.from_str(json.dumps(spec))
        except Exception as e:  # HF raises a bare Exception subclass; keep one line.
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ValueError(f"{source}: invalid HF tokenizer spec ({msg})") from None
        try:
            return cls(hf, name=str(obj.get("name", "bpe")))
        except ValueError as e:
            raise ValueError(f"{source}: {e}") from None


def new_byte_level_bpe() -> tokenizers.Tokenizer:
    """An empty HF tokenizer with the byte-exact GPT-2 pipeline (no normalizer)."""
    hf = tokenizers.Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.decoder = decoders.ByteLevel()
    return hf


def train_bpe(
    texts: Iterable[str],
    vocab_size: int,
    special_tokens: Sequence[str] = (),
    name: str = "bpe",
    min_frequency: int = 0,
) -> BPETokenizer:
    """Trains a byte-level BPE tokenizer, deterministically.

    The same texts, size and specials always give the same vocabulary and merges (the
    HF trainer breaks count ties by pair ids, not by hash order), hence the same
    `fingerprint`.

    Args:
        texts: Training strings (each is pre-tokenised on its own).
        vocab_size: Target size including the 256 byte symbols and the special tokens;
            the result is smaller if the text runs out of pairs to merge.
        special_tokens: Strings that must encode as single ids (e.g. ``"<think>"``);
            they get ids ``0 .. len-1``.
        name: Label for the tokenizer.
        min_frequency: Minimum pair count for a merge.

    Returns:
        The trained `BPETokenizer`.

    Raises:
        ValueError: If ``vocab_size`` cannot hold the byte alphabet and the specials.
    """
    specials = list(special_tokens)
    if len(set(specials)) != len(specials) or any(not s for s in specials):
        raise ValueError(f"special tokens must be distinct non-empty strings: {specials}")
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + len(specials):
        raise ValueError(
            f"vocab_size {vocab_size} < 256 byte symbols + {len(specials)} special tokens"
        )
    hf = new_byte_level_bpe()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[AddedToken(s, special=True, normalized=False) for s in specials],
        initial_alphabet=alphabet,
        show_progress=False,
    )
    hf.train_from_iterator(texts, trainer=trainer)
    return BPETokenizer(hf, name=name)
