"""`HFTokenizer`: any Hugging Face ``tokenizer.json`` (Llama, Qwen2, Mistral, GPT-2, ...)
behind specjax's byte-exact `Tokenizer` interface.

Cross-vocabulary verification compares vocabularies token by token through their
*bytes* (`vocab_map.py`), so every id needs the exact bytes it stands for. Token strings
in a ``tokenizer.json`` are spelled in one of three conventions, normalised here:

- **byte-level** (GPT-2, Llama 3, Qwen2): every byte is a printable stand-in character
  (``Ġ`` = space, ``Ċ`` = newline); ``'Ġthe'`` -> ``b' the'``;
- **SentencePiece** (Llama 2, Mistral): ``▁`` (U+2581) stands for a space, the rest is
  UTF-8 text; ``'▁the'`` -> ``b' the'``;
- **byte fallback** (SentencePiece with ``byte_fallback``): ``<0x0A>`` is the single
  byte 0x0A, used for bytes no piece covers.

Added tokens (``<s>``, ``<|endoftext|>``, ...) are their UTF-8 text, matched verbatim
by `encode`.

Exactness: `encode` runs the tokenizer's own model and pre-tokenizer, minus the parts
that do not round-trip: SentencePiece's dummy prefix (a ``▁`` prepended to the text, the
reason ``decode(encode('hi'))`` is ``' hi'`` in HF) and Unicode normalisation (NFC/NFKC,
precompiled charsmaps). Every encoding is checked to spell its input exactly, so
``decode(encode(text)) == text`` holds or a one-line error says why (e.g. a
SentencePiece vocabulary without byte fallback cannot spell a character it lacks).
``hf_encode`` gives HF's own encoding (dummy prefix, BOS) for prompting a model the way
it was trained.

Vocabulary padding: checkpoints often have more embedding rows than the tokenizer has
ids (Qwen2: 151936 rows, 151665 ids). ``pad_to`` appends ids that stand for no bytes
(`token_bytes` is ``b''``: never produced by `encode`, never in a vocabulary
intersection) so the tokenizer's id space matches the model's.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import tokenizers

from specjax.errors import ConfigError
from specjax.tokenizers.base import Tokenizer
from specjax.tokenizers.bpe import byte_to_unicode, unicode_to_byte

__all__ = ["HFTokenizer", "load_hf_tokenizer", "token_string_bytes"]

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_ESCAPED_RUN = re.compile("[\udc80-\udcff]+")
# Normalizers dropped from the exact encoder (they change text; dropping them keeps the
# same model and pieces, only unnormalised text may segment differently).
_DROPPED_NORMALIZERS = {"Prepend", "NFC", "NFD", "NFKC", "NFKD", "Precompiled"}
# Normalizers that lose information: no exact encoding exists.
_LOSSY_NORMALIZERS = {"Lowercase", "Strip", "StripAccents", "BertNormalizer"}


def _walk(node: Any):
    """Every dict inside a tokenizer.json component (Sequences included)."""
    if isinstance(node, dict):
        yield node
        for v in node.values():
            yield from _walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v)


def _types(node: Any) -> set[str]:
    return {d.get("type") for d in _walk(node) if isinstance(d.get("type"), str)}


def _style(spec: dict) -> tuple[str, str]:
    """('byte_level' | 'sentencepiece' | 'plain', the SentencePiece space symbol)."""
    parts = [spec.get("pre_tokenizer"), spec.get("decoder"), spec.get("normalizer")]
    if any("ByteLevel" in _types(p) for p in parts):
        return "byte_level", ""
    for p in parts:
        for d in _walk(p):
            if d.get("type") == "Metaspace":
                return "sentencepiece", d.get("replacement", "▁")
            if d.get("type") == "Replace" and "▁" in (
                str(d.get("content")) + str((d.get("pattern") or {}).get("String"))
            ):
                return "sentencepiece", "▁"
    return "plain", ""


def token_string_bytes(
    token: str, style: str, space: str = "▁", byte_fallback: bool = False
) -> bytes:
    """The bytes a vocabulary entry stands for, under the tokenizer's convention.

    Args:
      token: the entry as spelled in ``tokenizer.json``.
      style: 'byte_level', 'sentencepiece' or 'plain'.
      space: SentencePiece's space symbol.
      byte_fallback: ``<0xXX>`` entries are single bytes.

    Raises:
      ValueError: a byte-level entry with a character outside the byte alphabet.
    """
    if byte_fallback:
        m = _BYTE_TOKEN.fullmatch(token)
        if m:
            return bytes([int(m.group(1), 16)])
    if style == "byte_level":
        to_byte = unicode_to_byte()
        try:
            return bytes(to_byte[c] for c in token)
        except KeyError:
            raise ValueError(f"token {token!r} is not spelled in the byte-level alphabet") from None
    if style == "sentencepiece":
        return token.replace(space, " ").encode("utf-8")
    return token.encode("utf-8")


def _exact_spec(spec: dict, name: str) -> dict:
    """A copy of the pipeline without dummy prefixes and Unicode normalisation."""
    spec = copy.deepcopy(spec)
    lossy = _types(spec.get("normalizer")) & _LOSSY_NORMALIZERS
    if lossy:
        raise ConfigError(
            f"tokenizer {name}: normalizer {sorted(lossy)[0]} loses information; "
            "allowed: tokenizers whose text can be recovered exactly"
        )

    def strip(node):
        if node is None:
            return None
        if node.get("type") in _DROPPED_NORMALIZERS:
            return None
        if node.get("type") == "Sequence":
            kept = [n for n in (strip(x) for x in node.get("normalizers", [])) if n is not None]
            return None if not kept else {**node, "normalizers": kept}
        return node

    spec["normalizer"] = strip(spec.get("normalizer"))
    for d in _walk(spec.get("pre_tokenizer")):
        if d.get("type") == "Metaspace":
            d["prepend_scheme"] = "never"
            d.pop("add_prefix_space", None)
        if d.get("type") == "ByteLevel":
            d["add_prefix_space"] = False
    spec["post_processor"] = None
    spec["truncation"] = None
    spec["padding"] = None
    return spec


class HFTokenizer(Tokenizer):
    """A ``tokenizer.json`` behind the byte-exact interface (see the module docstring).

    Args:
      spec: the parsed ``tokenizer.json``.
      name: label for logs and errors.
      pad_to: the model's embedding rows, if more than the tokenizer's ids (padding ids
        stand for no bytes).

    Raises:
      ConfigError: one line naming the problem (unsupported model type, a token that is
        not valid in its convention, ids that are not contiguous, ...).
    """

    kind = "hf"

    def __init__(self, spec: dict[str, Any], name: str = "hf", pad_to: int | None = None):
        self.name = name
        self._spec = spec
        where = f"tokenizer {name}"
        model = spec.get("model") or {}
        if model.get("type") not in ("BPE", "Unigram", "WordLevel"):
            raise ConfigError(
                f"{where}: model type {model.get('type')!r} is not supported "
                "(allowed: 'BPE', 'Unigram', 'WordLevel')"
            )
        try:
            self._hf = tokenizers.Tokenizer.from_str(json.dumps(spec))
            self._exact = tokenizers.Tokenizer.from_str(json.dumps(_exact_spec(spec, name)))
        except ConfigError:
            raise
        except Exception as e:  # the Rust side raises bare Exceptions; keep one line
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ConfigError(f"{where}: invalid tokenizer.json ({msg})") from None
        self.style, self._space = _style(spec)
        self.byte_fallback = bool(model.get("byte_fallback"))
        added = self._hf.get_added_tokens_decoder()
        self._specials = {t.content: i for i, t in added.items() if t.special}
        vocab = self._hf.get_vocab(with_added_tokens=True)
        n_ids = max(vocab.values()) + 1 if vocab else 0
        self.n_tokenizer_ids = n_ids
        size = n_ids if pad_to is None else int(pad_to)
        if size < n_ids:
            raise ConfigError(
                f"{where}: pad_to={pad_to} is below its {n_ids} ids (allowed: pad_to >= {n_ids})"
            )
        table = [b""] * size
        for token, tid in vocab.items():
            if tid in added:
                table[tid] = added[tid].content.encode("utf-8")
                continue
            try:
                table[tid] = token_string_bytes(token, self.style, self._space, self.byte_fallback)
            except ValueError as e:
                raise ConfigError(f"{where}: id {tid}: {e}") from None
        self._bytes = table
        self._byte_ids: dict[int, int] = {}
        if self.byte_fallback:
            for token, tid in vocab.items():
                m = _BYTE_TOKEN.fullmatch(token)
                if m and tid not in added:
                    self._byte_ids[int(m.group(1), 16)] = tid

    # ------------------------------------------------------------------ interface
    @property
    def vocab_size(self) -> int:
        return len(self._bytes)

    @property
    def special_tokens(self) -> dict[str, int]:
        return dict(self._specials)

    @property
    def hf(self) -> tokenizers.Tokenizer:
        """The wrapped HF tokenizer, with its own pipeline (read-only use, please)."""
        return self._hf

    def hf_encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """HF's own encoding (dummy prefix, BOS, normalisation): what the model saw."""
        return self._hf.encode(text, add_special_tokens=add_special_tokens).ids

    @property
    def prompt_prefix(self) -> tuple[int, ...]:
        """The special ids HF's own pipeline puts before a text (e.g. Llama's BOS ``<s>``,
        from the ``post_processor`` template), which a model trained with them expects at
        the start of a prompt; () when it adds none. `encode` never adds them (it spells
        text exactly); a deployment prepends them to prompts (``assemble(..., bos=True)``)."""
        probe = "a"
        with_special = self._hf.encode(probe, add_special_tokens=True).ids
        plain = self._hf.encode(probe, add_special_tokens=False).ids
        specials = set(self._specials.values())
        prefix = []
        for i in with_special:
            if i not in specials or with_special[len(prefix) : len(prefix) + len(plain)] == plain:
                break
            prefix.append(i)
        return tuple(prefix)

    def _check(self, ids: list[int], data: bytes) -> list[int]:
        got = b"".join(self._bytes[i] for i in ids)
        if got != data:
            raise ValueError(
                f"tokenizer {self.name}: cannot spell {data[:40]!r} exactly "
                f"(got {got[:40]!r}); its vocabulary lacks a piece and has no "
                "byte fallback"
            )
        return ids

    def encode(self, text: str) -> list[int]:
        ids = self._exact.encode(text, add_special_tokens=False).ids
        return self._check(ids, text.encode("utf-8", errors="surrogateescape"))

    def encode_bytes(self, data: bytes) -> list[int]:
        """Tokenises raw bytes; valid UTF-8 runs as `encode`, each run of undecodable bytes
        (a character cut by another vocabulary) as byte-level symbols merged by the model,
        or as byte-fallback ids."""
        text = data.decode("utf-8", errors="surrogateescape")
        if not _ESCAPED_RUN.search(text):
            return self.encode(text)
        out: list[int] = []
        pos = 0
        for m in _ESCAPED_RUN.finditer(text):
            if m.start() > pos:
                out.extend(self.encode(text[pos : m.start()]))
            raw = bytes(ord(c) - 0xDC00 for c in m.group(0))
            if self.style == "byte_level":
                to_unicode = byte_to_unicode()
                out.extend(
                    t.id for t in self._exact.model.tokenize("".join(to_unicode[b] for b in raw))
                )
            elif self.byte_fallback:
                out.extend(self._byte_ids[b] for b in raw)
            else:
                raise ValueError(
                    f"tokenizer {self.name}: cannot spell the bytes {raw!r} "
                    "(not UTF-8, and no byte fallback)"
                )
            pos = m.end()
        if pos < len(text):
            out.extend(self.encode(text[pos:]))
        return self._check(out, data)

    def token_bytes(self, token_id: int) -> bytes:
        return self._bytes[self._check_id(token_id)]

    def all_token_bytes(self) -> list[bytes]:
        return list(self._bytes)

    def _fingerprint_payload(self) -> dict[str, Any]:
        spec = json.dumps(self._spec, sort_keys=True, ensure_ascii=True)
        return {
            "kind": self.kind,
            "tokens": [b.hex() for b in self._bytes],
            "special_ids": sorted(self._specials.values()),
            "spec_sha256": hashlib.sha256(spec.encode("ascii")).hexdigest(),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "vocab_size": self.vocab_size,
            "tokenizer": self._spec,
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any], source: str = "<json>") -> HFTokenizer:
        spec = obj.get("tokenizer")
        if not isinstance(spec, dict):
            raise ValueError(f"{source}: HF tokenizer JSON lacks a 'tokenizer' object")
        return cls(spec, name=str(obj.get("name", "hf")), pad_to=obj.get("vocab_size"))


def load_hf_tokenizer(
    path: str | os.PathLike[str], pad_to: int | None = None, name: str | None = None
) -> HFTokenizer:
    """An `HFTokenizer` from a ``tokenizer.json`` file or a folder holding one.

    Raises:
      ConfigError: one line naming the file (missing, not JSON, unsupported).
    """
    p = Path(path)
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise ConfigError(f"tokenizer {p}: missing (a local tokenizer.json is needed)")
    try:
        spec = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"tokenizer {p}: not valid JSON ({e})") from None
    if not isinstance(spec, dict):
        raise ConfigError(f"tokenizer {p}: expected a JSON object")
    try:
        return HFTokenizer(spec, name=name or p.parent.name or p.stem, pad_to=pad_to)
    except ConfigError as e:
        raise ConfigError(f"{p}: {e}") from None
