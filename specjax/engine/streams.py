"""PRNG streams of the engine: every key is a `fold_in` chain, never seed arithmetic.

A row's randomness comes from its *row key* (u32[2] key data, one per row). Inside the
engine each use folds a stream tag and the row's absolute position into it, so a row's
output depends on its key and its position only — not on the batch it is in, nor on how
its generation was split into calls (plan steps continuing a carried cache draw the same
noise as one long call would).

Row keys themselves come from `row_keys_for(seed, batch, share, stream=...)`: the seed's
key folded with each tag of `stream` (ints, or strings hashed with CRC-32), then with the
row index. Different streams of one seed never collide, unlike ``seed * 1000 + step``
(seed 10's step 0 was seed 0's step 10 000).
"""
from __future__ import annotations

import functools
import zlib
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ['STREAM_DRAFT', 'STREAM_VERIFY', 'STREAM_NOISE', 'STREAM_BONUS', 'stream_tag',
           'row_keys_for', 'fold_keys', 'gumbel_noise', 'sample_rows']

# Stream tags folded into a row key (stable: changing one changes every sampled output).
STREAM_DRAFT, STREAM_VERIFY, STREAM_NOISE, STREAM_BONUS = 1, 2, 3, 4


def stream_tag(tag) -> int:
    """An int tag as itself (mod 2**32), a string as its CRC-32."""
    if isinstance(tag, str):
        return zlib.crc32(tag.encode())
    if isinstance(tag, (int, np.integer)) and not isinstance(tag, bool):
        return int(tag) % (1 << 32)
    raise TypeError(f'stream tag: got {tag!r}; allowed: an int or a str')


def row_keys_for(seed: int, batch: int, share: int = 1,
                 stream: Sequence[int | str] | int | str = ()) -> np.ndarray:
    """Key data u32[B, 2]: row b gets key(seed) ⊕ stream tags ⊕ (b // share).

    `share` rows share noise (rule 'coupled' relies on it). ``stream=()`` gives the keys
    of the first version (so stored results stay reproducible); a plan runner names its
    streams, e.g. ``stream=('step', 3)`` or ``stream=('fallback', 3)``.
    """
    tags = (stream,) if isinstance(stream, (int, str, np.integer)) else tuple(stream)
    return np.asarray(jax.device_get(_row_keys(int(seed), int(batch), int(share),
                                               tuple(stream_tag(t) for t in tags))))


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _row_keys(seed: int, batch: int, share: int, tags: tuple):
    base = jax.random.key(seed)
    for t in tags:
        base = jax.random.fold_in(base, np.uint32(t))
    return jax.vmap(lambda i: jax.random.key_data(jax.random.fold_in(base, i)))(
        jnp.arange(batch) // share)


def fold_keys(row_keys: jax.Array, *folds) -> jax.Array:
    """Per-row keys (typed) from key data u32[B, 2], folded with per-row (array) or shared
    (int) values in order."""
    def one(k, *f):
        k = jax.random.wrap_key_data(k)
        for x in f:
            k = jax.random.fold_in(k, x)
        return k
    axes = (0,) + tuple(0 if jnp.ndim(f) else None for f in folds)
    return jax.vmap(one, in_axes=axes)(row_keys, *folds)


def gumbel_noise(row_keys: jax.Array, length: jax.Array, gamma: int, vocab: int) -> jax.Array:
    """f32[B, γ+1, V]: the Gumbel noise of absolute positions length..length+γ (rule 4)."""
    def one(k, n):
        k = jax.random.wrap_key_data(k)
        ks = jax.vmap(lambda j: jax.random.fold_in(jax.random.fold_in(k, STREAM_NOISE),
                                                   n + j))(jnp.arange(gamma + 1))
        return jax.vmap(lambda kk: jax.random.gumbel(kk, (vocab,)))(ks)
    return jax.vmap(one)(row_keys, length)


def sample_rows(keys: jax.Array, probs: jax.Array) -> jax.Array:
    """One token per row of ``probs: f32[B, V]`` with typed ``keys: [B]``, by inverse CDF.

    Exactly the law of ``probs`` (up to f32 rounding of the running sum, ~1e-7, as the
    Gumbel-max sampler's logs): token x is drawn iff ``C[x-1] <= u * C[V-1] < C[x]`` for
    one uniform u per row, so a token of probability 0 (``C[x] == C[x-1]``) is never drawn.
    One random number per row instead of V Gumbel draws: on XLA:CPU the V threefry hashes
    and two logs per row cost ~0.5 ms per step at B = 32 × V = 1024 (a third of the
    verifier's matmuls), this ~0.07 ms.
    """
    u = jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(keys)
    c = jnp.cumsum(probs.astype(jnp.float32), axis=-1)
    x = jnp.sum(c <= (u * c[:, -1])[:, None], axis=-1)
    return jnp.minimum(x, probs.shape[-1] - 1).astype(jnp.int32)
