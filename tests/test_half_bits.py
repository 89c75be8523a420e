"""16-bit float caches and tables are gathered and scattered as uint16 bits
(`specjax.models.cache.half_set` / `half_get` / `half_take`): bit-identical to the float
ops, and on XLA:CPU without the f32 copy of the whole operand the float ops make."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.models import cache as C

HALF = [jnp.bfloat16, jnp.float16]


@pytest.fixture
def as_bits():
    """Sets `HALF_AS_BITS` for one call, restoring it after."""
    old = C.HALF_AS_BITS

    def run(setting, fn, *args):
        C.HALF_AS_BITS = setting
        try:
            # A new function each call: traced afresh (the setting is read at trace time;
            # jit's cache would otherwise hand back the first trace of ``fn``).
            return jax.jit(lambda *a: fn(*a))(*args)
        finally:
            C.HALF_AS_BITS = old

    return run


def _cache(dtype, b=2, kv=3, hd=4, s=16, seed=0):
    k = jax.random.normal(jax.random.PRNGKey(seed), (b, kv, hd, s)).astype(dtype)
    v = jax.random.normal(jax.random.PRNGKey(seed + 1), (b, kv, s, hd)).astype(dtype)
    return k, v


@pytest.mark.parametrize("dtype", HALF)
def test_writes_reads_and_compaction_are_bit_identical(as_bits, dtype):
    k, v = _cache(dtype)
    block = jax.random.normal(jax.random.PRNGKey(2), (2, 3, 5, 4)) * 3.0  # f32: rounded once
    length = jnp.array([3, 13])  # row 1 overflows: slots past capacity are dropped

    def writes(k, v, block, length):
        return C.write_keys(k, block, length), C.write_block(v, block, length)

    def compaction(k, v, length):
        cache = C.Cache(k=C.PerLayer([k]), v=C.PerLayer([v]), length=length)
        out = C.compact(cache, jnp.array([[4, 1, 2], [2, 0, 1]]), jnp.array([3, 2]))
        return out.k[0], out.v[0], out.length

    for fn, args in ((writes, (k, v, block, length)), (compaction, (k, v, length))):
        want = as_bits(False, fn, *args)
        got = as_bits(True, fn, *args)
        for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(
                np.asarray(a).view(np.uint16) if a.dtype != jnp.int32 else np.asarray(a),
                np.asarray(b).view(np.uint16) if b.dtype != jnp.int32 else np.asarray(b),
            )
    # The overflowing row kept its committed slots and dropped what did not fit.
    wk, _ = as_bits(True, writes, k, v, block, length)
    np.testing.assert_array_equal(np.asarray(wk[1, :, :, :13]), np.asarray(k[1, :, :, :13]))


@pytest.mark.parametrize("dtype", [*HALF, jnp.float32])
def test_take_is_bit_identical_and_keeps_the_dtype(as_bits, dtype):
    table = (jax.random.normal(jax.random.PRNGKey(0), (50, 8)) * 10).astype(dtype)
    ids = jnp.array([[0, 49, 7, 7]])
    want = np.asarray(jnp.take(table, ids, axis=0))
    for setting in (True, False, None):
        got = as_bits(setting, lambda t, i: C.half_take(t, i, axis=0), table, ids)
        assert got.dtype == dtype
        np.testing.assert_array_equal(np.asarray(got), want)


def _f32_copies(hlo: str, shape: str) -> int:
    return len(re.findall(rf"= f32\[{shape}\]\S* (?:convert|scatter|gather)\(", hlo))


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's lowering")
def test_cpu_programs_make_no_f32_copy_of_a_bf16_cache_or_table():
    k, v = _cache(jnp.bfloat16, b=1, kv=2, hd=8, s=64)
    table = jnp.ones((256, 8), jnp.bfloat16)
    block = jnp.ones((1, 2, 3, 8), jnp.float32)

    def step(k, v, table, ids, length):
        def body(c, _):
            k, v, length = c
            x = C.half_take(table, ids, axis=0).astype(jnp.float32).sum()
            return (
                C.write_keys(k, block * x, length),
                C.write_block(v, block, length),
                length + 3,
            ), None

        return jax.lax.scan(body, (k, v, length), None, length=4)[0]

    args = (k, v, table, jnp.array([1, 2]), jnp.array([0]))
    old = C.HALF_AS_BITS
    try:
        texts = {}
        for setting in (False, None):
            C.HALF_AS_BITS = setting
            texts[setting] = jax.jit(lambda *a: step(*a)).lower(*args).compile().as_text()
    finally:
        C.HALF_AS_BITS = old
    # The float ops, on the CPU: the cache written as f32 and the table converted to f32.
    assert _f32_copies(texts[False], "1,2,8,64") + _f32_copies(texts[False], "256,8") > 0
    assert _f32_copies(texts[None], "1,2,8,64") == _f32_copies(texts[None], "1,2,64,8") == 0
    assert _f32_copies(texts[None], "256,8") == 0


def _copies_of(text: str, shape: str) -> int:
    """Instructions outside bitcasts that make a whole [shape] array (a copy or a convert)."""
    return sum(
        1
        for line in text.splitlines()
        if re.search(rf"= (f32|bf16|u16)\[{shape}\]", line)
        and "parameter(" not in line
        and " bitcast(" not in line
        and "get-tuple-element" not in line
        and "tuple(" not in line
    )


def test_a_table_stored_as_bits_is_not_copied_per_call():
    """A bf16 table a decode loop reads by row: the bitcast `half_take` makes is loop
    invariant, so XLA:CPU hoists it out of the loop and materialises it (a whole-table
    copy per call); the table stored as bits (`table_bits`) is read in place."""
    table = jax.random.normal(jax.random.PRNGKey(0), (512, 8)).astype(jnp.bfloat16)

    def loop(table, ids):
        def body(acc, i):
            rows = C.half_take(table, (ids + i) % 512, dtype=jnp.bfloat16)
            return acc + rows.astype(jnp.float32).sum(), None

        return jax.lax.scan(body, jnp.zeros(()), jnp.arange(4))[0]

    ids = jnp.array([1, 2])
    old = C.HALF_AS_BITS
    try:
        C.HALF_AS_BITS = True
        bits = C.table_bits(table)
        plain = jax.jit(loop).lower(table, ids).compile().as_text()
        stored = jax.jit(loop).lower(bits, ids).compile().as_text()
        assert bits.dtype == jnp.uint16
        np.testing.assert_array_equal(
            np.asarray(C.table_values(bits, jnp.bfloat16)), np.asarray(table)
        )
        assert float(jax.jit(loop)(bits, ids)) == float(jax.jit(loop)(table, ids))
    finally:
        C.HALF_AS_BITS = old
    assert _copies_of(plain, "512,8") > 0
    assert _copies_of(stored, "512,8") == 0
    with pytest.raises(ValueError, match="16-bit float dtype"):
        C.half_take(bits, ids)


def test_a_model_with_its_table_as_bits_gives_the_same_logits():
    """An untied bf16 model's table stored as bits: the same logits bit for bit, and
    `api.embedding_table` and the HF export read the values."""
    from specjax.models.api import (
        TransformerConfig,
        TransformerLM,
        causal_block_mask,
        embedding_table,
    )
    from specjax.models.fused import separate_leaf

    cfg = TransformerConfig(
        vocab_size=64,
        d_model=16,
        n_layers=2,
        n_heads=2,
        n_kv_heads=1,
        d_ff=32,
        max_len=16,
        tie_embeddings=False,
        dtype="bfloat16",
        param_dtype="bfloat16",
    )
    lm = TransformerLM(cfg)
    params = lm.init_params(0)
    old = C.HALF_AS_BITS
    try:
        C.HALF_AS_BITS = True
        bits = dict(params, embed=C.table_bits(params["embed"]))
        tokens = jnp.array([[3, 9, 27, 5]])
        pos = jnp.arange(4)[None]
        mask = causal_block_mask(1, 4)
        fwd = jax.jit(lambda p: lm.forward(p, lm.init_cache(1, 16), tokens, pos, mask)[0])
        np.testing.assert_array_equal(np.asarray(fwd(bits)), np.asarray(fwd(params)))
    finally:
        C.HALF_AS_BITS = old
    assert bits["embed"].dtype == jnp.uint16
    for table in (embedding_table(lm, bits), separate_leaf(cfg, bits, ("embed",))):
        assert table.dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(table), np.asarray(params["embed"]))
