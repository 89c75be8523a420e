"""The unrolled threefry (specjax.verify.streams) is jax.random, bit for bit.

The engine draws every random number of a round through `fold_data` / `split_data` /
`uniform_data` / `gumbel_data` / `categorical_data` instead of `jax.random` (whose hash
XLA:CPU runs as a rolled loop); stored results stay reproducible only if the bits are
the same, so every function is compared for exact equality with its `jax.random`
counterpart, inside `jit` and under `vmap`, on many keys. Tokens are drawn from those
uniforms by inverse CDF (`sample_rows_u`, two levels over a large vocabulary): its law is
checked by χ² at the end.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.verify import streams
from specjax.verify.distributions import sample

N = 512


def _keys(n=N, seed=0):
    return jnp.asarray(streams.row_keys_for(seed, n))


def _ref(fn, kd, *args):
    return jax.jit(jax.vmap(lambda k, *a: fn(jax.random.wrap_key_data(k), *a)))(kd, *args)


def test_threefry_matches_jax():
    kd = _keys()
    x1 = jnp.arange(N, dtype=jnp.uint32) * np.uint32(2654435761)
    x2 = jnp.arange(N, dtype=jnp.uint32) ^ np.uint32(0xDEADBEEF)
    from jax._src.random.threefry2x32 import threefry2x32_p  # pylint: disable=import-outside-toplevel

    ref = jax.jit(lambda k, a, b: threefry2x32_p.bind(k[:, 0], k[:, 1], a, b))(kd, x1, x2)
    out = jax.jit(lambda k, a, b: streams.threefry2x32(k[:, 0], k[:, 1], a, b))(kd, x1, x2)
    for r, o in zip(ref, out):
        np.testing.assert_array_equal(np.asarray(r), np.asarray(o))


def test_fold_split_uniform_gumbel_categorical_match_jax_random():
    kd = _keys()
    length = jnp.arange(N, dtype=jnp.int32) * 7 + 3
    # fold chains (ints and per-row arrays, as the engine folds them)
    ref = _ref(
        lambda k, n: jax.random.key_data(
            jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(k, 1), n), 2)
        ),
        kd,
        length,
    )
    out = jax.jit(lambda k, n: streams.fold_data(k, 1, n, 2))(kd, length)
    np.testing.assert_array_equal(np.asarray(ref), np.asarray(out))
    typed = jax.jit(lambda k, n: jax.random.key_data(streams.fold_keys(k, 1, n, 2)))(kd, length)
    np.testing.assert_array_equal(np.asarray(ref), np.asarray(typed))
    for num in (2, 3, 5):
        ref = _ref(lambda k: jax.random.key_data(jax.random.split(k, num)), kd)
        out = jax.jit(lambda k: streams.split_data(k, num))(kd)
        np.testing.assert_array_equal(np.asarray(ref), np.asarray(out))
    for shape in ((), (3,), (2, 4), (1024,)):
        ref = _ref(lambda k: jax.random.uniform(k, shape), kd)
        out = jax.jit(lambda k: streams.uniform_data(k, shape))(kd)
        np.testing.assert_array_equal(np.asarray(ref), np.asarray(out))
        ref = _ref(lambda k: jax.random.bits(k, shape, jnp.uint32), kd)
        out = jax.jit(lambda k: streams.bits_data(k, shape))(kd)
        np.testing.assert_array_equal(np.asarray(ref), np.asarray(out))
    ref = _ref(lambda k: jax.random.gumbel(k, (1024,)), kd)
    out = jax.jit(lambda k: streams.gumbel_data(k, (1024,)))(kd)
    np.testing.assert_array_equal(np.asarray(ref), np.asarray(out))
    # categorical over log-probabilities with zeros (-inf), as `sample` calls it
    probs = jax.nn.softmax(jax.random.normal(jax.random.key(1), (N, 37)) * 2.0, -1)
    probs = probs.at[:, ::3].set(0.0)
    probs = probs / probs.sum(-1, keepdims=True)
    ref = _ref(lambda k, p: jax.random.categorical(k, jnp.log(p)), kd, probs)
    out = jax.jit(jax.vmap(lambda k, p: streams.categorical_data(k, jnp.log(p))))(kd, probs)
    np.testing.assert_array_equal(np.asarray(ref), np.asarray(out))
    out = jax.jit(jax.vmap(lambda k, p: sample(jax.random.wrap_key_data(k), p)))(kd, probs)
    np.testing.assert_array_equal(np.asarray(ref), np.asarray(out))
    # one key for a whole [rows, V] array (the noise covers every row), as jax's
    ref = jax.random.categorical(jax.random.key(5), jnp.log(probs))
    np.testing.assert_array_equal(np.asarray(ref), np.asarray(sample(jax.random.key(5), probs)))


def test_gumbel_noise_is_per_absolute_position():
    """Position n's noise depends on (row key, n) only: two windows that overlap agree."""
    kd = _keys(8)
    a = streams.gumbel_noise(kd, jnp.full((8,), 5), 3, 16)
    b = streams.gumbel_noise(kd, jnp.full((8,), 7), 3, 16)
    np.testing.assert_array_equal(np.asarray(a[:, 2:]), np.asarray(b[:, :2]))
    ref = _ref(
        lambda k, n: jax.random.gumbel(
            jax.random.fold_in(jax.random.fold_in(k, streams.STREAM_NOISE), n), (16,)
        ),
        kd,
        jnp.full((8,), 6),
    )
    np.testing.assert_array_equal(np.asarray(ref), np.asarray(a[:, 1]))


@pytest.mark.parametrize("flag", ["jax_threefry_partitionable"])
def test_non_default_configuration_falls_back_to_jax_random(flag):
    kd = _keys(16)
    old = getattr(jax.config, flag)
    try:
        jax.config.update(flag, not old)
        ref = _ref(lambda k: jax.random.uniform(jax.random.fold_in(k, 3), (5,)), kd)
        out = jax.jit(lambda k: streams.uniform_data(streams.fold_data(k, 3), (5,)))(kd)
        np.testing.assert_array_equal(np.asarray(ref), np.asarray(out))
    finally:
        jax.config.update(flag, old)


def test_argmax_first_is_jnp_argmax():
    """The engine's two-reduction argmax equals jnp.argmax: ties, -inf, NaN, every axis."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 4, (16, 5, 33)).astype(np.float32)  # many ties
    x[0, 0] = -np.inf
    x[1, 1, 7] = np.nan
    x[1, 2, [3, 9]] = np.nan
    x[2, 3] = np.inf
    x[2, 4, [1, 30]] = np.inf
    x = jnp.asarray(x)
    for axis in (0, 1, 2, -1):
        np.testing.assert_array_equal(
            np.asarray(jnp.argmax(x, axis=axis)),
            np.asarray(jax.jit(streams.argmax_first, static_argnums=1)(x, axis)),
        )


@pytest.mark.slow  # CI time (make test ≤ 15 min on a cold clone); `make test-all` runs it
def test_two_level_inverse_cdf_has_the_law_of_its_weights():
    """`sample_rows_u` over a vocabulary past 1,024 ids (blocks of ~√V): unnormalised
    weights with zero ids and whole zero blocks; χ² (N 200k, α 1e-3) against the weights,
    zero-weight ids never drawn (u at both ends included), and the same token as one
    running sum over all V for nearly every u (they differ only by f32 rounding)."""
    from scipy import stats  # pylint: disable=import-outside-toplevel

    rng = np.random.default_rng(3)
    v = 3000  # blocks of 64: 47 blocks, the last padded
    w = rng.gamma(0.3, size=v)
    w[rng.random(v) < 0.3] = 0.0
    w[640:900] = 0.0  # whole blocks without mass
    w[-5:] = 0.0  # a zero tail
    w = 7.3 * w
    n, chunk = 200_000, 20_000  # drawn in chunks: [n, V] f32 at once is 2.4 GB per copy
    u = jax.random.uniform(jax.random.key(0), (n,))
    probs = jnp.broadcast_to(jnp.asarray(w, jnp.float32), (chunk, v))
    two_level = jax.jit(streams.sample_rows_u)
    flat_cdf = jax.jit(streams._inverse_cdf)  # pylint: disable=protected-access
    parts = [u[i : i + chunk] for i in range(0, n, chunk)]
    got = np.concatenate([np.asarray(two_level(c, probs)) for c in parts])
    assert w[got].min() > 0, "a zero-weight id was drawn"
    p = w / w.sum()
    counts = np.bincount(got, minlength=v)
    big = p * n >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(p[big] * n, p[~big].sum() * n)
    stat = ((obs - exp) ** 2 / exp).sum()
    p_value = stats.chi2.sf(stat, len(obs) - 1)
    assert p_value >= 1e-3, f"two-level inverse CDF: χ² rejects (p = {p_value:.3g})"
    flat = np.concatenate([np.asarray(flat_cdf(c, probs)) for c in parts])
    assert (flat == got).mean() > 0.9999
    ends = jnp.array([0.0, 1.0 - 2.0**-24, 0.5])
    at = np.asarray(streams.sample_rows_u(ends, jnp.asarray(np.stack([w] * 3), jnp.float32)))
    assert (w[at] > 0).all() and at[0] == np.flatnonzero(w)[0]
    assert at[1] == np.flatnonzero(w)[-1]


def test_small_vocabularies_use_one_running_sum():
    u = jax.random.uniform(jax.random.key(1), (64,))
    probs = jax.nn.softmax(jax.random.normal(jax.random.key(2), (64, 1024)), -1)
    np.testing.assert_array_equal(
        np.asarray(streams.sample_rows_u(u, probs)),
        np.asarray(streams._inverse_cdf(u, probs)),  # pylint: disable=protected-access
    )
