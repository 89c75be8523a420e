"""`ByteTokenizer`: one id per byte (0..255), plus optional special tokens after them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specjax.tokenizers.base import Tokenizer, split_special


class ByteTokenizer(Tokenizer):
    """Ids ``0..255`` are the bytes themselves; special token ``k`` is id ``256 + k``.

    Args:
        special_tokens: Strings encoded as single ids wherever they occur in text.
        name: Label for logs and reports.
    """

    kind = "byte"

    def __init__(self, special_tokens: Sequence[str] = (), name: str = "byte") -> None:
        specials = list(special_tokens)
        if len(set(specials)) != len(specials):
            raise ValueError(f"duplicate special tokens: {specials}")
        if any(not s for s in specials):
            raise ValueError("special tokens must be non-empty strings")
        self.name = name
        self._specials = specials
        self._special_ids = {s: 256 + k for k, s in enumerate(specials)}
        self._special_by_bytes = {s.encode("utf-8"): 256 + k for k, s in enumerate(specials)}

    @property
    def vocab_size(self) -> int:
        return 256 + len(self._specials)

    @property
    def special_tokens(self) -> dict[str, int]:
        return dict(self._special_ids)

    def encode_bytes(self, data: bytes) -> list[int]:
        if not self._specials:
            return list(data)
        out: list[int] = []
        for piece, special in split_special(data, list(self._special_by_bytes)):
            if special:
                out.append(self._special_by_bytes[piece])
            else:
                out.extend(piece)
        return out

    def token_bytes(self, token_id: int) -> bytes:
        token_id = self._check_id(token_id)
        if token_id < 256:
            return bytes([token_id])
        return self._specials[token_id - 256].encode("utf-8")

    def _fingerprint_payload(self) -> dict[str, Any]:
        return {"kind": self.kind, "special_tokens": self._specials}

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "special_tokens": self._specials}

    @classmethod
    def from_json(cls, obj: dict[str, Any], source: str = "<json>") -> ByteTokenizer:
        specials = obj.get("special_tokens", [])
        if not isinstance(specials, list) or not all(isinstance(s, str) for s in specials):
            raise ValueError(f"{source}: 'special_tokens' must be a list of strings")
        return cls(special_tokens=specials, name=str(obj.get("name", "byte")))
