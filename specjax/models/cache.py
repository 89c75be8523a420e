"""The KV cache of the functional LM API and its commit helpers.

Slot ``s`` of row ``b`` is committed iff ``s < length[b]``; every other slot is garbage
and always masked, so rolling back is only ``length`` moving back. ``forward`` writes a
block at slots ``[length, length + T)`` without moving ``length``; the caller commits
with :func:`advance` (a chain) or :func:`compact` (a token tree's accepted path).

Layout: one array per layer, keys ``f32[B, KV, hd, S]`` and values ``f32[B, KV, S, hd]``
(on a TPU keys ``[B, KV, S, hd]`` too: `KEYS_SLOTS_MAJOR`)
(batch and KV heads leading; each stored the way its attention dot reads it: the scores
``q·K`` contract ``hd`` with the keys' rows, the output ``p·V`` contracts the slots with the
values' rows, so neither operand is repacked). Keys stored ``[S, hd]`` cost a transposing
pack of every key on every call on XLA:CPU's batched dots: 1.34 ms of a batch-32 decode
step over the zoo verifier's 4 layers against 0.24 ms stored ``[hd, S]`` (issue 10,
measured on this CPU). Measured earlier against the stacked
``[n_layers, B, S, KV, hd]`` layout of the first version and a stacked
``[n_layers, B, KV, S, hd]``: with S between the batch dimensions every layer's keys were
transposed on every call, and with a stacked leading layer axis ``k[layer]`` is a copy of
that layer on every call (a ``slice`` fusion feeding the dot); per-layer arrays in this
order feed the attention dots directly and are updated in place inside ``while_loop``. On
TPU the same order is the one the MXU wants (batch dims leading, contraction minor).

Capacity ``S`` is chosen per cache (``init_cache(..., capacity)``), not fixed at the
model's context: an engine call sizes its caches to what the call can fill (prompt width +
new tokens + one block). Attention reads a cache of fewer than 4 blocks of 128 slots whole;
a longer one in blocks, only those that hold a committed slot of some row
(``specjax.models.transformer.cache_attention``).

Writes use scatters with ``mode='drop'``: a slot at or past capacity is dropped, never
clamped onto committed slots (``dynamic_update_slice`` would clamp its start and
silently overwrite history). Keeping ``length + T <= capacity`` is the caller's job; the
logits of an overflowing block are still exact (attention reads the block's own keys),
but its cache entries are lost.

On XLA:CPU a gather or scatter on bf16 or f16 runs in f32: the whole operand (a layer's
cache, an embedding table) is converted to f32 and the result back, on every write. Writes,
reads and row gathers of 16-bit floats therefore go through the same bits as ``uint16``
(`half_set`, `half_get`, `half_take`): bit-identical, and on the CPU without the copies.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from specjax.runtime import backend

#: Gathers and scatters of 16-bit floats as uint16 bits: None (default) where programs are
#: traced for the CPU only (`specjax.runtime.backend.platform`: a compile-only TPU target is not),
#: True / False everywhere (a paired comparison, a test). Read at trace time.
HALF_AS_BITS: bool | None = None


#: Keys stored slots-major, ``[B, KV, S, hd]`` like the values, instead of ``[B, KV, hd, S]``:
#: None (default) where programs are traced for a TPU (`specjax.runtime.backend.platform`) and the
#: heads are at least a 128-wide lane, True / False everywhere (a test). Read at trace
#: time. On a TPU the minor dimension is the lane: with slots minor a block's keys are
#: columns, and at batch > 1 the compiler relaid every layer's keys in and out of each call
#: to write them (a 2-layer model of 128-dim heads at batch 8 and 4,096 slots: one 16 MiB
#: copy per layer; none slots-major). Heads narrower than a lane (SmolLM2's 64) the
#: compiler stores slots-minor whatever the program asks, so they keep that layout. On the
#: CPU ``[hd, S]`` is the layout its batched dot reads without a repack (module docstring).
KEYS_SLOTS_MAJOR: bool | None = None


LANE = 128  # a TPU vector register's minor dimension


def keys_slots_major(head_dim: int) -> bool:
    """Whether keys of ``head_dim`` are stored ``[B, KV, S, hd]`` (`KEYS_SLOTS_MAJOR`)."""
    if KEYS_SLOTS_MAJOR is None:
        return backend.platform() == 'tpu' and head_dim >= LANE
    return bool(KEYS_SLOTS_MAJOR)


def _as_bits(dtype) -> bool:
    dtype = jnp.dtype(dtype)
    if dtype not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return False
    return backend.platform() == 'cpu' if HALF_AS_BITS is None else bool(HALF_AS_BITS)


def _bits(x: jax.Array) -> jax.Array:
    return jax.lax.bitcast_convert_type(x, jnp.uint16)


def half_set(arr: jax.Array, idx, values: jax.Array, mode: str = 'drop') -> jax.Array:
    """``arr.at[idx].set(values.astype(arr.dtype), mode=mode)``, through uint16 bits for a
    16-bit float ``arr`` (module docstring)."""
    values = values.astype(arr.dtype)
    if not _as_bits(arr.dtype):
        return arr.at[idx].set(values, mode=mode)
    out = _bits(arr).at[idx].set(_bits(values), mode=mode)
    return jax.lax.bitcast_convert_type(out, arr.dtype)


def half_get(arr: jax.Array, idx, mode: str = 'clip') -> jax.Array:
    """``arr.at[idx].get(mode=mode)``, through uint16 bits for a 16-bit float ``arr``."""
    if not _as_bits(arr.dtype):
        return arr.at[idx].get(mode=mode)
    return jax.lax.bitcast_convert_type(_bits(arr).at[idx].get(mode=mode), arr.dtype)


def half_take(table: jax.Array, ids: jax.Array, axis: int = 0, dtype=None) -> jax.Array:
    """``jnp.take(table, ids, axis)`` (rows of an embedding table), through uint16 bits for
    a 16-bit float table: XLA:CPU would otherwise convert the whole table to f32 (hoisted
    out of a decode loop, once per call: 113 MB for SmolLM2's bf16 table).

    The bitcast of a table that is a loop invariant is itself hoisted out of the loop and
    materialised (a 56 MB copy per call, ~16 ms on the 2-core Xeon): a table only read by
    row is therefore best stored as its bits already (`table_bits`); ``table`` may be
    that uint16 array, its rows returned as ``dtype`` (the half-precision type it holds).
    """
    if table.dtype == jnp.uint16:
        if dtype is None or jnp.dtype(dtype).itemsize != 2:
            raise ValueError(
                f'half_take: a uint16 table needs its 16-bit float dtype (got {dtype})'
            )
        return jax.lax.bitcast_convert_type(jnp.take(table, ids, axis=axis), dtype)
    if not _as_bits(table.dtype):
        return jnp.take(table, ids, axis=axis)
    return jax.lax.bitcast_convert_type(jnp.take(_bits(table), ids, axis=axis), table.dtype)


def table_bits(table: jax.Array) -> jax.Array:
    """A table read only by row (`half_take`) in the storage it is fastest read from: a
    16-bit float table as its uint16 bits where gathers go through bits (the CPU), with
    its sharding; any other table unchanged."""
    if not _as_bits(table.dtype):
        return table
    sharding = getattr(table, 'sharding', None)
    return jax.jit(_bits, out_shardings=sharding)(table)


def table_values(table: jax.Array, dtype) -> jax.Array:
    """The values of a table that `table_bits` may have stored as bits (``dtype``: the
    16-bit float type it holds); any other table unchanged."""
    if table.dtype == jnp.uint16 and jnp.dtype(dtype) != jnp.uint16:
        return jax.lax.bitcast_convert_type(table, dtype)
    return table


@jax.tree_util.register_pytree_node_class
class PerLayer(tuple):
    """A tuple of per-layer arrays of one shape (a pytree whose children are the layers).

    ``shape`` / ``dtype`` are those of one layer, so a tree of logical axis names that
    holds *one* name tuple for the field (``Cache.logical_axes()``) maps onto every layer
    (``specjax.runtime.sharding`` broadcasts a sharding over the layers as a tree prefix).
    """

    @property
    def shape(self):
        return self[0].shape

    @property
    def dtype(self):
        return self[0].dtype

    def tree_flatten(self):
        return tuple(self), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        del aux
        return cls(children)


@struct.dataclass
class Cache:
    """k: ``PerLayer`` of n_layers arrays f32[B, KV, hd, S] (post-rotary keys, slots
    minor); v: ``PerLayer`` of n_layers arrays f32[B, KV, S, hd]; length: i32[B]."""

    k: PerLayer
    v: PerLayer
    length: jax.Array

    @property
    def max_len(self) -> int:
        """The capacity S (slots per row)."""
        return self.v.shape[2]

    capacity = max_len

    @property
    def batch(self) -> int:
        return self.k.shape[0]

    @property
    def n_layers(self) -> int:
        return len(self.k)

    @staticmethod
    def logical_axes(head_dim: int = 0) -> 'Cache':
        """Logical axis names of each field (one name tuple per field: the same for every
        layer; see `PerLayer`). The keys' last two names follow `keys_slots_major` for
        ``head_dim`` (both are unsplit by every rule set, so a placement does not depend
        on it)."""
        values = ('batch', 'kv_heads', 'cache_length', 'head_dim')
        major = keys_slots_major(head_dim)
        keys = values if major else ('batch', 'kv_heads', 'head_dim', 'cache_length')
        return Cache(k=keys, v=values, length=('batch',))


def init_cache(
    n_layers: int, batch: int, capacity: int, n_kv_heads: int, head_dim: int, dtype=jnp.float32
) -> Cache:
    v_shape = (batch, n_kv_heads, capacity, head_dim)
    k_shape = v_shape if keys_slots_major(head_dim) else (batch, n_kv_heads, head_dim, capacity)
    return Cache(
        k=PerLayer(jnp.zeros(k_shape, dtype) for _ in range(n_layers)),
        v=PerLayer(jnp.zeros(v_shape, dtype) for _ in range(n_layers)),
        length=jnp.zeros((batch,), jnp.int32),
    )


def _rows_len(cache: Cache, x, name: str) -> jax.Array:
    x = jnp.asarray(x, jnp.int32)
    if x.ndim > 1 or (x.ndim == 1 and x.shape[0] != cache.batch):
        raise ValueError(f'{name}: expected a scalar or i32[{cache.batch}], got shape {x.shape}')
    return jnp.broadcast_to(x, (cache.batch,))


def _index(batch: int, kv: int, slots: jax.Array):
    """Scatter/gather indices (rows, heads, slots) for ``slots: i32[B, T]`` on [B, KV, S, hd]."""
    return (jnp.arange(batch)[:, None, None], jnp.arange(kv)[None, :, None], slots[:, None, :])


def _index_t(batch: int, kv: int, hd: int, slots: jax.Array):
    """Scatter/gather indices (rows, heads, dims, slots) for ``slots: i32[B, T]`` on
    [B, KV, hd, S] (keys)."""
    return (
        jnp.arange(batch)[:, None, None, None],
        jnp.arange(kv)[None, :, None, None],
        jnp.arange(hd)[None, None, :, None],
        slots[:, None, None, :],
    )


def write_block(arr: jax.Array, block: jax.Array, length: jax.Array) -> jax.Array:
    """Writes one layer's values ``block: [B, KV, T, hd]`` into ``arr: [B, KV, S, hd]`` at
    slots ``[length, length + T)`` of each row (slots past capacity are dropped)."""
    B, KV, T = block.shape[:3]
    slots = length[:, None] + jnp.arange(T)[None, :]  # [B, T]
    return half_set(arr, _index(B, KV, slots), block)


def write_keys(arr: jax.Array, block: jax.Array, length: jax.Array) -> jax.Array:
    """Writes one layer's keys ``block: [B, KV, T, hd]`` into ``arr: [B, KV, hd, S]`` (or
    ``[B, KV, S, hd]`` where `keys_slots_major`) at
    slots ``[length, length + T)`` of each row (slots past capacity are dropped)."""
    B, KV, T, hd = block.shape
    if keys_slots_major(hd):  # [B, KV, S, hd], as the values
        return write_block(arr, block, length)
    slots = length[:, None] + jnp.arange(T)[None, :]  # [B, T]
    return half_set(arr, _index_t(B, KV, hd, slots), block.transpose(0, 1, 3, 2))


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
    B, KV, hd = cache.batch, cache.v.shape[1], cache.v.shape[3]
    base = cache.length[:, None]
    dst = base + jnp.arange(K)[None, :]

    def mover(src_idx, dst_idx):
        def move(x):
            return half_set(x, dst_idx, half_get(x, src_idx, mode='clip'), mode='drop')

        return move

    if keys_slots_major(hd):
        move_k = mover(_index(B, KV, base + src), _index(B, KV, dst))
    else:
        move_k = mover(_index_t(B, KV, hd, base + src), _index_t(B, KV, hd, dst))
    move_v = mover(_index(B, KV, base + src), _index(B, KV, dst))
    return advance(
        cache.replace(k=PerLayer(map(move_k, cache.k)), v=PerLayer(map(move_v, cache.v))), n
    )


def block_rows(x: jax.Array, at: jax.Array) -> jax.Array:
    """``x[b, at[b, r]]``: rows ``at: i32[B, R]`` of a block ``x [B, T, ...]`` → [B, R, ...]
    (what a forward's head reads when only some block positions' logits are wanted)."""
    idx = at.astype(jnp.int32).reshape(at.shape + (1,) * (x.ndim - 2))
    return jnp.take_along_axis(x, idx, axis=1)


def select_rows(cache, rows: jax.Array):
    """The caches of rows ``rows: i32[B']`` (a gather along the batch; any cache pytree
    whose leaves all lead with the batch, e.g. a synthetic LM's ``LengthCache``)."""
    return jax.tree.map(lambda x: jnp.take(x, rows, axis=0), cache)
