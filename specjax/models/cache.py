"""The KV cache of the functional LM API and its commit helpers.

Slot ``s`` of row ``b`` is committed iff ``s < length[b]``; every other slot is garbage
and always masked, so rolling back is only ``length`` moving back. ``forward`` writes a
block at slots ``[length, length + T)`` without moving ``length``; the caller commits
with :func:`advance` (a chain) or :func:`compact` (a token tree's accepted path).

Writes use scatters with ``mode='drop'``: a slot at or past capacity is dropped, never
clamped onto committed slots (``dynamic_update_slice`` would clamp its start and
silently overwrite history). Keeping ``length + T <= max_len`` is the caller's job; the
logits of an overflowing block are still exact (attention reads the block's own keys),
but its cache entries are lost.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class Cache:
    """k, v: f32[n_layers, B, L, n_kv_heads, head_dim] (post-rotary keys); length: i32[B]."""

    k: jax.Array
    v: jax.Array
    length: jax.Array

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    @staticmethod
    def logical_axes() -> 'Cache':
        """Logical axis names of each field (for ``specjax.sharding``)."""
        kv = ('layers', 'batch', 'cache_length', 'kv_heads', 'head_dim')
        return Cache(k=kv, v=kv, length=('batch',))


def init_cache(n_layers: int, batch: int, max_len: int, n_kv_heads: int, head_dim: int,
               dtype=jnp.float32) -> Cache:
    shape = (n_layers, batch, max_len, n_kv_heads, head_dim)
    return Cache(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype),
                 length=jnp.zeros((batch,), jnp.int32))


def _rows_len(cache: Cache, x, name: str) -> jax.Array:
    x = jnp.asarray(x, jnp.int32)
    if x.ndim > 1 or (x.ndim == 1 and x.shape[0] != cache.batch):
        raise ValueError(f'{name}: expected a scalar or i32[{cache.batch}], got shape {x.shape}')
    return jnp.broadcast_to(x, (cache.batch,))


def write_layer(arr: jax.Array, layer: int, block: jax.Array, length: jax.Array) -> jax.Array:
    """Writes one layer's ``block: [B, T, KV, hd]`` into ``arr: [n_layers, B, L, KV, hd]``
    at slots ``[length, length + T)`` of each row (slots past capacity are dropped)."""
    B, T = block.shape[0], block.shape[1]
    rows = jnp.arange(B)[:, None]
    slots = length[:, None] + jnp.arange(T)[None, :]  # [B, T]
    return arr.at[layer, rows, slots].set(block.astype(arr.dtype), mode='drop')


def advance(cache: Cache, n) -> Cache:
    """``length += n`` (keeps the first ``n`` block slots), capped at capacity."""
    n = _rows_len(cache, n, 'advance(n)')
    return cache.replace(length=jnp.minimum(cache.length + n, cache.max_len))


def rollback(cache: Cache, new_length) -> Cache:
    """``length = new_length``; values outside ``[0, length]`` are clamped into it."""
    new_length = _rows_len(cache, new_length, 'rollback(new_length)')
    return cache.replace(length=jnp.clip(new_length, 0, cache.length))


def compact(cache: Cache, src, n) -> Cache:
    """Moves block slot ``length+src[b,i]`` to ``length+i`` (i < K), then ``length += n``.

    Turns a scored token tree into its accepted path: ``src[b]`` lists the block indices
    of the accepted nodes in path order (entries past ``n[b]`` are don't-cares). All
    sources are gathered before any write, so overlapping moves are safe.

    Args:
      cache: the cache after ``forward`` scored the tree block.
      src: i32[B, K] block indices.
      n: i32[B] (or scalar) number of slots to commit, ``n <= K``.
    """
    src = jnp.asarray(src, jnp.int32)
    if src.ndim != 2 or src.shape[0] != cache.batch:
        raise ValueError(f'compact(src): expected i32[{cache.batch}, K], got shape {src.shape}')
    K = src.shape[1]
    rows = jnp.arange(cache.batch)[:, None]
    base = cache.length[:, None]
    src_slots = base + src
    dst_slots = base + jnp.arange(K)[None, :]

    def move(x):
        moved = x.at[:, rows, src_slots].get(mode='clip')  # [n_layers, B, K, KV, hd]
        return x.at[:, rows, dst_slots].set(moved, mode='drop')

    return advance(cache.replace(k=move(cache.k), v=move(cache.v)), n)
