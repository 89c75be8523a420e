"""Synthetic exact language models: next-token tables whose sequence law is computable.

A `BigramLM` is a table `logits[prev, next]`; it plugs into the engine through the same
functional LM API as the transformer (ARCHITECTURE.md), so every rule and policy can be
run end to end on it and its output compared with the exactly computed target
distribution (the χ² suite; `specjax.testing.sequence_distribution`). Researchers use it to
study a rule in isolation.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax.models.cache import block_rows


@struct.dataclass
class LengthCache:
    """A cache with no keys/values: a table LM only needs the token it is given."""

    length: jax.Array  # i32[B]


@dataclasses.dataclass(frozen=True)
class BigramLM:
    """Next-token logits indexed by the current token: `forward(...)[b, t] = table[tokens[b, t]]`.

    Attributes:
        vocab_size: V.
        max_len: nominal context capacity (the table has no context limit; kept for the API).
    """

    vocab_size: int
    max_len: int = 1 << 20

    def init_cache(self, batch: int, capacity: int | None = None) -> LengthCache:
        del capacity  # nothing is stored per slot
        return LengthCache(length=jnp.zeros((batch,), jnp.int32))

    def forward(self, params, cache, tokens, positions, block_mask, logits_at=None):
        del positions, block_mask  # The next-token law depends on the current token only.
        if logits_at is not None:
            tokens = block_rows(tokens, logits_at)
        return params["table"][tokens].astype(jnp.float32), cache

    def advance(self, cache, n):
        return cache.replace(length=cache.length + n)

    def rollback(self, cache, new_length):
        return cache.replace(length=new_length)

    def compact(self, cache, src, n):
        del src
        return cache.replace(length=cache.length + n)


def random_table(rng: np.random.Generator, vocab: int, sharpness: float = 1.0) -> np.ndarray:
    """A random logits table f32[V, V] (Gaussian logits scaled by `sharpness`)."""
    return (rng.standard_normal((vocab, vocab)) * sharpness).astype(np.float32)
