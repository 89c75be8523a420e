"""PRNG streams of the rules and the engine: every key is a `fold_in` chain, never seed arithmetic.

It lives in `verify/` because the rules draw from it (`rules`, `distributions`); the engine
builds on both.

A row's randomness comes from its *row key* (u32[2] key data, one per row). Inside the
engine each use folds a stream tag and the row's absolute position into it, so a row's
output depends on its key and its position only — not on the batch it is in, nor on how
its generation was split into calls (plan steps continuing a carried cache draw the same
noise as one long call would).

Row keys themselves come from `row_keys_for(seed, batch, share, stream=...)`: the seed's
key folded with each tag of `stream` (ints, or strings hashed with CRC-32), then with the
row index. Different streams of one seed never collide, unlike ``seed * 1000 + step``
(seed 10's step 0 was seed 0's step 10 000).

Inside a round the numbers are computed by `threefry2x32` below, an unrolled copy of the
hash behind `jax.random` (the default threefry implementation with
``jax_threefry_partitionable``), so `fold_data`, `split_data`, `uniform_data` and
`gumbel_data` return *bit for bit* what `jax.random.fold_in` / `split` / `uniform` /
`gumbel` return for the same key (tests/test_streams.py checks it), only cheaper: on
XLA:CPU `jax.random` lowers the hash as a 5-trip `while` loop, so every key derivation or
draw was a loop of ~15 thunks (most of them copies of the loop state) per trip, some 1,000
thunks per round; unrolled, a whole chain of folds and the draw after it is one fusion.
Under a non-default PRNG configuration they fall back to `jax.random` itself.
"""

from __future__ import annotations

import functools
import math
import zlib
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    'STREAM_DRAFT',
    'STREAM_VERIFY',
    'STREAM_NOISE',
    'STREAM_BONUS',
    'stream_tag',
    'row_keys_for',
    'fold_keys',
    'gumbel_noise',
    'sample_rows',
    'threefry2x32',
    'key_data',
    'fold_data',
    'split_data',
    'bits_data',
    'uniform_data',
    'gumbel_data',
    'categorical_data',
    'sample_rows_u',
    'argmax_first',
]

# Stream tags folded into a row key (stable: changing one changes every sampled output).
STREAM_DRAFT, STREAM_VERIFY, STREAM_NOISE, STREAM_BONUS = 1, 2, 3, 4


def stream_tag(tag) -> int:
    """An int tag as itself (mod 2**32), a string as its CRC-32."""
    if isinstance(tag, str):
        return zlib.crc32(tag.encode())
    if isinstance(tag, (int, np.integer)) and not isinstance(tag, bool):
        return int(tag) % (1 << 32)
    raise TypeError(f'stream tag: got {tag!r}; allowed: an int or a str')


def row_keys_for(
    seed: int, batch: int, share: int = 1, stream: Sequence[int | str] | int | str = ()
) -> np.ndarray:
    """Key data u32[B, 2]: row b gets key(seed) ⊕ stream tags ⊕ (b // share).

    `share` rows share noise (rule 'coupled' relies on it). ``stream=()`` gives the keys
    of the first version (so stored results stay reproducible); a plan runner names its
    streams, e.g. ``stream=('step', 3)`` or ``stream=('fallback', 3)``.
    """
    tags = (stream,) if isinstance(stream, (int, str, np.integer)) else tuple(stream)
    return np.asarray(
        jax.device_get(
            _row_keys(int(seed), int(batch), int(share), tuple(stream_tag(t) for t in tags))
        )
    )


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _row_keys(seed: int, batch: int, share: int, tags: tuple):
    base = jax.random.key(seed)
    for t in tags:
        base = jax.random.fold_in(base, np.uint32(t))
    return jax.vmap(lambda i: jax.random.key_data(jax.random.fold_in(base, i)))(
        jnp.arange(batch) // share
    )


# ----------------------------------------------------------------------------------------
# jax.random's threefry, unrolled (bit-identical)
# ----------------------------------------------------------------------------------------

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def threefry2x32(k1, k2, x1, x2):
    """The Threefry-2x32 hash of `jax.random` (20 rounds), unrolled: u32 arrays that
    broadcast together → (y1, y2). The same arithmetic as jax's own lowering (which XLA:CPU
    gets as a rolled 5-trip loop), so the same bits."""
    k1, k2, x1, x2 = (jnp.asarray(a, jnp.uint32) for a in (k1, k2, x1, x2))
    ks = (k1, k2, k1 ^ k2 ^ np.uint32(0x1BD11BDA))
    x1, x2 = x1 + ks[0], x2 + ks[1]
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x1 = x1 + x2
            x2 = (x2 << np.uint32(r)) | (x2 >> np.uint32(32 - r))
            x2 = x1 ^ x2
        x1 = x1 + ks[(i + 1) % 3]
        x2 = x2 + ks[(i + 2) % 3] + np.uint32(i + 1)
    return x1, x2


def _exact() -> bool:
    """Whether the unrolled hash reproduces `jax.random` under the current configuration
    (read at trace time): threefry keys, partitionable bits, low-range Gumbel."""
    return (
        jax.config.jax_default_prng_impl == 'threefry2x32'
        and jax.config.jax_threefry_partitionable
        and not jax.config.jax_high_dynamic_range_gumbel
    )


def key_data(keys) -> jax.Array:
    """u32[..., 2] key data of typed keys (key data is returned as it is)."""
    if jnp.issubdtype(keys.dtype, jax.dtypes.prng_key):
        return jax.random.key_data(keys)
    return jnp.asarray(keys, jnp.uint32)


def _wrap(kd):
    return jax.random.wrap_key_data(kd)


def _map_keys(fn, kd):
    """`fn(typed key) -> array` mapped over the leading dimensions of key data kd."""
    lead = kd.shape[:-1]
    flat = kd.reshape((-1, kd.shape[-1]))
    out = jax.vmap(lambda k: fn(_wrap(k)))(flat)
    return out.reshape(lead + out.shape[1:])


def fold_data(kd, *folds) -> jax.Array:
    """Key data u32[..., 2] folded with `folds` in order (ints or integer arrays that
    broadcast against kd[..., 0]): `jax.random.fold_in` applied element by element."""
    kd = key_data(kd)
    if not _exact():
        for f in folds:
            f = jnp.asarray(f)
            shape = jnp.broadcast_shapes(kd.shape[:-1], f.shape)
            kd_b = jnp.broadcast_to(kd, shape + (2,)).reshape(-1, 2)
            f_b = jnp.broadcast_to(f, shape).reshape(-1)
            kd = jax.vmap(lambda k, x: jax.random.key_data(jax.random.fold_in(_wrap(k), x)))(
                kd_b, f_b
            ).reshape(shape + (2,))
        return kd
    k1, k2 = kd[..., 0], kd[..., 1]
    for f in folds:
        f = jnp.asarray(f, dtype=jnp.uint32)  # as jax.random.fold_in converts it
        # threefry_seed(uint32 d) = (d >> 32, d) = (0, d), hashed as one block of two words.
        k1, k2 = threefry2x32(k1, k2, jnp.zeros_like(f), f)
    return jnp.stack(jnp.broadcast_arrays(k1, k2), axis=-1)


def split_data(kd, num: int) -> jax.Array:
    """u32[..., num, 2]: `jax.random.split(key, num)` of each key."""
    kd = key_data(kd)
    if not _exact():
        return _map_keys(lambda k: jax.random.key_data(jax.random.split(k, num)), kd)
    i = jnp.arange(num, dtype=jnp.uint32)
    b1, b2 = threefry2x32(kd[..., 0, None], kd[..., 1, None], jnp.zeros_like(i), i)
    return jnp.stack([b1, b2], axis=-1)


def bits_data(kd, shape: tuple) -> jax.Array:
    """u32[..., *shape]: `jax.random.bits(key, shape)` of each key (32-bit)."""
    kd = key_data(kd)
    shape = tuple(shape)
    if not _exact():
        return _map_keys(lambda k: jax.random.bits(k, shape, jnp.uint32), kd)
    n = int(np.prod(shape))
    if n >= 1 << 32:
        raise ValueError(f'bits_data: {n} numbers per key; allowed: < 2**32')
    lo = jnp.arange(n, dtype=jnp.uint32).reshape(shape)
    pad = (None,) * len(shape)
    b1, b2 = threefry2x32(kd[(..., 0) + pad], kd[(..., 1) + pad], jnp.zeros_like(lo), lo)
    return b1 ^ b2


def _floats(bits, minval, maxval):
    """jax.random.uniform's map from 32 random bits to f32 in [minval, maxval)."""
    minval, maxval = np.float32(minval), np.float32(maxval)
    fb = (bits >> np.uint32(32 - 23)) | np.array(1.0, np.float32).view(np.uint32)
    floats = jax.lax.bitcast_convert_type(fb, jnp.float32) - np.float32(1.0)
    return jnp.maximum(minval, floats * (maxval - minval) + minval)


def uniform_data(kd, shape: tuple = ()) -> jax.Array:
    """f32[..., *shape]: `jax.random.uniform(key, shape)` of each key."""
    kd = key_data(kd)
    if not _exact():
        return _map_keys(lambda k: jax.random.uniform(k, tuple(shape), jnp.float32), kd)
    if not shape:  # one block of counter (0, 0)
        b1, b2 = threefry2x32(kd[..., 0], kd[..., 1], np.uint32(0), np.uint32(0))
        return _floats(b1 ^ b2, 0.0, 1.0)
    return _floats(bits_data(kd, shape), 0.0, 1.0)


def gumbel_data(kd, shape: tuple) -> jax.Array:
    """f32[..., *shape]: `jax.random.gumbel(key, shape)` of each key."""
    kd = key_data(kd)
    if not _exact():
        return _map_keys(lambda k: jax.random.gumbel(k, tuple(shape), jnp.float32), kd)
    tiny = np.finfo(np.float32).tiny
    return -jnp.log(-jnp.log(_floats(bits_data(kd, shape), tiny, 1.0)))


def argmax_first(x: jax.Array, axis: int = -1) -> jax.Array:
    """i32: `jnp.argmax(x, axis)` exactly (the first maximum; the first NaN if any), as a
    max and a min-index reduction. On XLA:CPU jnp.argmax is a variadic (value, index)
    reduction that runs 5-10x slower than these two plain ones (50 µs against 5 µs over
    [8, 1024]); the Gumbel-max samplers and the greedy one-hot sit on it every round."""
    axis = axis % x.ndim
    m = jnp.max(x, axis=axis, keepdims=True)
    hit = (x == m) | jnp.isnan(x)
    iota = jax.lax.broadcasted_iota(jnp.int32, x.shape, axis)
    return jnp.min(jnp.where(hit, iota, x.shape[axis]), axis=axis).astype(jnp.int32)


def categorical_data(kd, logits) -> jax.Array:
    """`jax.random.categorical(key, logits)` (last axis) for ONE key (data u32[2]): the
    Gumbel noise covers the whole of `logits`, as jax's does."""
    kd = key_data(kd)
    if kd.shape != (2,):
        raise ValueError(
            f'categorical_data: key data of shape {kd.shape}; allowed: (2,) (vmap over keys)'
        )
    return argmax_first(gumbel_data(kd, logits.shape) + logits)


# ----------------------------------------------------------------------------------------
# The engine's streams
# ----------------------------------------------------------------------------------------


def fold_keys(row_keys: jax.Array, *folds) -> jax.Array:
    """Per-row keys (typed) from key data u32[B, 2], folded with per-row (array) or shared
    (int) values in order."""
    folds = tuple(jnp.asarray(f) for f in folds)
    for f in folds:
        if f.ndim > 1 or (f.ndim == 1 and f.shape[0] != row_keys.shape[0]):
            raise ValueError(
                f'fold_keys: a fold of shape {f.shape}; allowed: a scalar or '
                f'one value per row ({row_keys.shape[0]})'
            )
    return jax.random.wrap_key_data(fold_data(row_keys, *folds))


def gumbel_noise(row_keys: jax.Array, length: jax.Array, gamma: int, vocab: int) -> jax.Array:
    """f32[B, γ+1, V]: the Gumbel noise of absolute positions length..length+γ (rule 4):
    position n's noise is `gumbel(fold_in(fold_in(row key, STREAM_NOISE), n), (V,))`."""
    n = length[:, None] + jnp.arange(gamma + 1)[None, :]
    kd = fold_data(key_data(row_keys)[:, None, :], STREAM_NOISE, n)
    return gumbel_data(kd, (vocab,))


def sample_rows_u(u: jax.Array, probs: jax.Array) -> jax.Array:
    """One token per row of ``probs: f32[..., V]`` (weights ≥ 0, not necessarily
    normalised) given its uniform ``u: f32[...]``, by inverse CDF (see `sample_rows`).

    Two levels over a large vocabulary: the ids in blocks of ~√V, the block picked by
    inverse CDF over the blocks' sums, then the id inside it over that block alone — the
    same map from ``u`` to a token as one running sum over all V ids (up to f32 rounding),
    but one reduction over V instead of a V-long running sum: 0.92 → 0.08 ms at [8, 49,152]
    on the 2-core Xeon (XLA:CPU's cumsum is a windowed reduction)."""
    v = probs.shape[-1]
    probs = probs.astype(jnp.float32)
    if v <= 1024:
        return _inverse_cdf(u, probs)
    block = 1 << round(math.log2(math.sqrt(v)))
    n_blocks = -(-v // block)
    pad = [(0, 0)] * (probs.ndim - 1) + [(0, n_blocks * block - v)]
    blocks = jnp.pad(probs, pad).reshape(probs.shape[:-1] + (n_blocks, block))
    c = jnp.cumsum(jnp.sum(blocks, axis=-1), axis=-1)  # [..., n_blocks]
    t = u * c[..., -1]
    b = _first_reaching(c, t)
    before = jnp.where(
        b > 0, jnp.take_along_axis(c, jnp.maximum(b - 1, 0)[..., None], -1)[..., 0], 0
    )
    inner = jnp.take_along_axis(blocks, b[..., None, None], axis=-2)[..., 0, :]  # [..., block]
    # t − before ≥ 0 (block b was picked with c[b − 1] ≤ t), and the inner cap keeps the
    # draw on an id of positive probability should rounding put it past the block's sum.
    x = _first_reaching(jnp.cumsum(inner, axis=-1), t - before)
    return jnp.minimum(b * block + x, v - 1).astype(jnp.int32)


def _inverse_cdf(u, probs):
    c = jnp.cumsum(probs, axis=-1)
    return jnp.minimum(_first_reaching(c, u * c[..., -1]), probs.shape[-1] - 1).astype(jnp.int32)


def _first_reaching(c: jax.Array, t: jax.Array) -> jax.Array:
    """i32[...]: the first index i of the running sum ``c: f32[..., N]`` with c[i] > t, or
    where it reaches its total. ``c < total`` caps the draw at the first id where the
    running sum reaches its total, an id of positive weight: it only binds when ``t``
    rounds up to the total (u within 2^-24 of 1), where an uncapped count would pick the
    last id, whose weight may be 0."""
    total = c[..., -1:]
    return jnp.sum((c <= t[..., None]) & (c < total), axis=-1).astype(jnp.int32)


def sample_rows(keys: jax.Array, probs: jax.Array) -> jax.Array:
    """One token per row of ``probs: f32[B, V]`` with typed ``keys: [B]``, by inverse CDF.

    Exactly the law of ``probs`` (up to f32 rounding of the running sum, ~1e-7, as the
    Gumbel-max sampler's logs): token x is drawn iff ``C[x-1] <= u * C[V-1] < C[x]`` for
    one uniform u per row, so a token of probability 0 (``C[x] == C[x-1]``) is never drawn.
    One random number per row instead of V Gumbel draws: on XLA:CPU the V threefry hashes
    and two logs per row cost ~0.5 ms per step at B = 32 × V = 1024 (a third of the
    verifier's matmuls), this ~0.07 ms.
    """
    return sample_rows_u(uniform_data(keys), probs)
