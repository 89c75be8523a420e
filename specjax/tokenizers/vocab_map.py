"""Maps between two vocabularies, through token bytes.

Cross-vocabulary verification (SPEC §3.3, token-level intersection) needs two tables:

- `intersection_map(drafter, verifier)`: which drafter tokens also exist, byte for
  byte, in the verifier vocabulary. A drafter of another tokenizer samples only from
  those (its ``q`` renormalised on them) and its samples are mapped to verifier ids.
- `retokenization_table(verifier, drafter)`: how a drafter consumes a committed
  verifier token, as a fixed sequence of its own ids (its tokenisation of the token's
  bytes), so drafter caches can follow the committed verifier stream inside `jit`.
"""

from __future__ import annotations

import numpy as np

from specjax.tokenizers.base import Tokenizer


def same_group(a: Tokenizer, b: Tokenizer) -> bool:
    """True iff ``a`` and ``b`` are the same tokenizer (equal fingerprints)."""
    return a is b or a.fingerprint() == b.fingerprint()


def _canonical_ids(dst: Tokenizer) -> dict[bytes, int]:
    """Bytes -> dst id, choosing one id when several share the same bytes.

    Duplicates happen (a special token whose text BPE also learnt as ordinary merges;
    GPT-2's ``<|endoftext|>``). The id ``dst`` itself produces for those bytes wins,
    because that is the id its model was trained to predict; otherwise the lowest id.
    """
    seen: dict[bytes, list[int]] = {}
    for i, b in enumerate(dst.all_token_bytes()):
        seen.setdefault(b, []).append(i)
    out: dict[bytes, int] = {}
    for b, ids in seen.items():
        if len(ids) > 1:
            enc = dst.encode_bytes(b)
            out[b] = enc[0] if len(enc) == 1 and enc[0] in ids else ids[0]
        else:
            out[b] = ids[0]
    return out


def intersection_map(src: Tokenizer, dst: Tokenizer) -> np.ndarray:
    """For each src id, the dst id with identical `token_bytes`, or -1.

    Args:
        src: The vocabulary mapped from (e.g. a drafter's).
        dst: The vocabulary mapped to (e.g. the verifier's).

    Returns:
        ``i32[src.vocab_size]``. The map need not be injective when ``src`` holds two
        ids with equal bytes; consumers mapping a distribution must scatter-add.
        Empty tokens never map (-1).
    """
    table = _canonical_ids(dst)
    out = np.full((src.vocab_size,), -1, dtype=np.int32)
    for i, b in enumerate(src.all_token_bytes()):
        if b:
            out[i] = table.get(b, -1)
    return out


def retokenization_table(src: Tokenizer, dst: Tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """Each src token's bytes re-tokenised in the dst vocabulary.

    Args:
        src: The vocabulary whose tokens are re-tokenised (e.g. the verifier's).
        dst: The vocabulary they are re-tokenised into (e.g. a drafter's).

    Returns:
        ``(ids, lengths)``: ``ids`` is ``i32[src.vocab_size, M]`` with row ``i`` =
        ``dst.encode_bytes(src.token_bytes(i))`` padded with 0, ``lengths`` is
        ``i32[src.vocab_size]``, and ``M`` is the longest row (at least 1).
    """
    rows = [dst.encode_bytes(b) for b in src.all_token_bytes()]
    width = max([1] + [len(r) for r in rows])
    ids = np.zeros((src.vocab_size, width), dtype=np.int32)
    lengths = np.zeros((src.vocab_size,), dtype=np.int32)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
        lengths[i] = len(r)
    return ids, lengths
