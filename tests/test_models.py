"""The transformer behind the functional LM API: cached scoring equals the full forward.

Tolerance: f32 throughout; cached and full forwards differ only in summation order
(masked slots contribute exact zeros), so 1e-5 absolute/relative on O(1) logits.
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.models.api import (
    TransformerLM,
    advance,
    causal_block_mask,
    compact,
    count_params,
    rollback,
)
from specjax.models.transformer import TransformerConfig

TOL = dict(atol=1e-5, rtol=1e-5)


@functools.partial(jax.jit, static_argnums=0)
def _forward(lm, params, cache, tokens, positions, mask):
    return lm.forward(params, cache, tokens, positions, mask)


@functools.partial(jax.jit, static_argnums=0)
def _full(lm, params, tokens):
    return lm.logits_full(params, tokens)


def _tokens(seed, shape, vocab):
    return jnp.asarray(np.random.default_rng(seed).integers(0, vocab, shape), jnp.int32)


def _chain_positions(cache, T):
    return cache.length[:, None] + jnp.arange(T, dtype=jnp.int32)[None, :]


def _prefill(lm, params, tokens, n=None):
    """Scores ``tokens`` from an empty cache and commits ``n`` (default: all) per row."""
    B, T = tokens.shape
    cache = lm.init_cache(B)
    logits, cache = _forward(
        lm, params, cache, tokens, _chain_positions(cache, T), causal_block_mask(B, T)
    )
    return logits, advance(cache, T if n is None else n)


def _tree_mask(K, gamma):
    """bool[1 + K*gamma, 1 + K*gamma]: root, then K chains; node sees root + its chain prefix."""
    T = 1 + K * gamma
    m = np.zeros((T, T), bool)
    m[:, 0] = True
    for k in range(K):
        for j in range(gamma):
            i = 1 + k * gamma + j
            m[i, 1 + k * gamma : i + 1] = True
    return m


def test_config_validation_names_field_value_and_range():
    with pytest.raises(ValueError, match=r'n_kv_heads=3.*divide n_heads=4'):
        TransformerConfig(d_model=32, n_heads=4, n_kv_heads=3)
    with pytest.raises(ValueError, match=r'n_kv_heads=8.*\[1, 4\]'):
        TransformerConfig(d_model=32, n_heads=4, n_kv_heads=8)
    with pytest.raises(ValueError, match=r'vocab_size=0.*>= 1'):
        TransformerConfig(vocab_size=0)
    with pytest.raises(ValueError, match=r'n_heads=3.*d_model=32'):
        TransformerConfig(d_model=32, n_heads=3, n_kv_heads=1)
    with pytest.raises(ValueError, match=r"dtype='int8'"):
        TransformerConfig(dtype='int8')
    cfg = TransformerConfig(dtype=jnp.bfloat16)
    assert cfg.dtype == 'bfloat16'
    assert TransformerConfig.from_dict(cfg.to_dict()) == cfg


def test_lm_is_hashable_static_and_params_are_plain(tiny_lm, tiny_params, tiny_config):
    assert tiny_lm == TransformerLM(tiny_config)
    assert hash(tiny_lm) == hash(TransformerLM(tiny_config))
    assert isinstance(tiny_params, dict) and all(isinstance(k, str) for k in tiny_params)
    axes = tiny_lm.param_logical_axes()
    shapes = jax.tree.map(lambda x: x.shape, tiny_params)
    jax.tree.map(
        lambda names, shape: len(names) == len(shape) or pytest.fail(f'{names} {shape}'),
        axes,
        shapes,
        is_leaf=lambda x: isinstance(x, tuple) and all(isinstance(a, (str, type(None))) for a in x),
    )
    assert axes['embed'] == ('vocab', 'embed')
    assert count_params(tiny_params) == count_params(tiny_lm.abstract_params())


def test_cached_decoding_equals_full_forward(tiny_lm, tiny_params):
    lm, params = tiny_lm, tiny_params
    B, P, steps = 2, 5, 6
    seq = _tokens(1, (B, P + steps), lm.vocab_size)
    full = _full(lm, params, seq)
    logits, cache = _prefill(lm, params, seq[:, :P])
    chex.assert_trees_all_close(logits, full[:, :P], **TOL)
    for t in range(P, P + steps):
        logits, cache = _forward(
            lm,
            params,
            cache,
            seq[:, t : t + 1],
            _chain_positions(cache, 1),
            causal_block_mask(B, 1),
        )
        cache = advance(cache, 1)
        chex.assert_trees_all_close(logits[:, 0], full[:, t], **TOL)
    np.testing.assert_array_equal(cache.length, [P + steps] * B)


def test_block_scoring_equals_full_forward_with_ragged_rows(tiny_lm, tiny_params):
    """Rows commit different prefix lengths; each row's causal block matches its own
    full forward (garbage slots >= length are masked)."""
    lm, params = tiny_lm, tiny_params
    B, P, T = 2, 8, 5
    prefix = _tokens(2, (B, P), lm.vocab_size)
    block = _tokens(3, (B, T), lm.vocab_size)
    n = jnp.array([P, P - 3], jnp.int32)
    _, cache = _prefill(lm, params, prefix, n)
    logits, _ = _forward(
        lm, params, cache, block, _chain_positions(cache, T), causal_block_mask(B, T)
    )
    for b in range(B):
        seq = jnp.concatenate([prefix[b, : int(n[b])], block[b]])[None]
        full = _full(lm, params, seq)
        chex.assert_trees_all_close(logits[b], full[0, int(n[b]) :], **TOL)


def _score_tree(lm, params, cache, root, chains):
    """root i32[B], chains i32[B, K, gamma] -> logits of the tree block, cache."""
    B, K, gamma = chains.shape
    tokens = jnp.concatenate([root[:, None], chains.reshape(B, K * gamma)], axis=1)
    depth = jnp.concatenate(
        [jnp.zeros(1, jnp.int32), jnp.tile(jnp.arange(1, gamma + 1, dtype=jnp.int32), K)]
    )
    positions = cache.length[:, None] + depth[None, :]
    mask = jnp.broadcast_to(_tree_mask(K, gamma), (B,) + (1 + K * gamma,) * 2)
    return _forward(lm, params, cache, tokens, positions, mask)


def test_tree_block_gives_each_chain_its_own_logits(tiny_lm, tiny_params):
    lm, params = tiny_lm, tiny_params
    B, P, K, gamma = 2, 6, 3, 4
    _, cache = _prefill(lm, params, _tokens(4, (B, P), lm.vocab_size))
    root = _tokens(5, (B,), lm.vocab_size)
    chains = _tokens(6, (B, K, gamma), lm.vocab_size)
    tree_logits, _ = _score_tree(lm, params, cache, root, chains)
    for k in range(K):
        block = jnp.concatenate([root[:, None], chains[:, k]], axis=1)
        chain_logits, _ = _forward(
            lm,
            params,
            cache,
            block,
            _chain_positions(cache, gamma + 1),
            causal_block_mask(B, gamma + 1),
        )
        idx = np.r_[0, 1 + k * gamma + np.arange(gamma)]
        chex.assert_trees_all_close(tree_logits[:, idx], chain_logits, **TOL)


def test_rollback_then_redecode_equals_fresh_decode(tiny_lm, tiny_params):
    lm, params = tiny_lm, tiny_params
    B, P, T = 2, 6, 4
    prefix = _tokens(7, (B, P), lm.vocab_size)
    _, cache = _prefill(lm, params, prefix)
    # A rejected continuation, committed and then rolled back.
    wrong = _tokens(8, (B, T), lm.vocab_size)
    _, cache = _forward(
        lm, params, cache, wrong, _chain_positions(cache, T), causal_block_mask(B, T)
    )
    cache = rollback(advance(cache, T), P)
    right = _tokens(9, (B, T), lm.vocab_size)
    logits, _ = _forward(
        lm, params, cache, right, _chain_positions(cache, T), causal_block_mask(B, T)
    )
    _, fresh = _prefill(lm, params, prefix)
    expected, _ = _forward(
        lm, params, fresh, right, _chain_positions(fresh, T), causal_block_mask(B, T)
    )
    chex.assert_trees_all_close(logits, expected, **TOL)
    # rollback never moves length forward.
    np.testing.assert_array_equal(rollback(cache, P + 5).length, [P] * B)


def test_compact_then_continue_equals_scoring_accepted_chain(tiny_lm, tiny_params):
    lm, params = tiny_lm, tiny_params
    B, P, K, gamma = 2, 5, 2, 3
    prefix = _tokens(10, (B, P), lm.vocab_size)
    _, cache = _prefill(lm, params, prefix)
    root = _tokens(11, (B,), lm.vocab_size)
    chains = _tokens(12, (B, K, gamma), lm.vocab_size)
    _, cache = _score_tree(lm, params, cache, root, chains)
    # Row 0 accepts 2 tokens of chain 1; row 1 accepts all 3 tokens of chain 0.
    accepted_chain = np.array([1, 0])
    n_accepted = np.array([2, 3])
    src = np.zeros((B, 1 + gamma), np.int32)  # entries past n are don't-cares (left 0)
    for b in range(B):
        k, a = accepted_chain[b], n_accepted[b]
        src[b, 1 : 1 + a] = 1 + k * gamma + np.arange(a)
    cache = compact(cache, jnp.asarray(src), jnp.asarray(1 + n_accepted))
    np.testing.assert_array_equal(cache.length, P + 1 + n_accepted)
    nxt = _tokens(13, (B, 2), lm.vocab_size)
    logits, _ = _forward(
        lm, params, cache, nxt, _chain_positions(cache, 2), causal_block_mask(B, 2)
    )
    for b in range(B):
        path = chains[b, accepted_chain[b], : n_accepted[b]]
        seq = jnp.concatenate([prefix[b], root[b : b + 1], path, nxt[b]])[None]
        full = _full(lm, params, seq)
        chex.assert_trees_all_close(logits[b], full[0, -2:], **TOL)


def test_decode_step_traces_once(tiny_lm, tiny_params):
    lm, params = tiny_lm, tiny_params
    B = 2

    @jax.jit
    @chex.assert_max_traces(n=1)
    def step(params, cache, token):
        logits, cache = lm.forward(
            params, cache, token, cache.length[:, None], causal_block_mask(B, 1)
        )
        return jnp.argmax(logits[:, -1], -1).astype(jnp.int32)[:, None], advance(cache, 1)

    cache, token = lm.init_cache(B), jnp.array([[1], [2]], jnp.int32)
    for _ in range(5):
        token, cache = step(params, cache, token)
    np.testing.assert_array_equal(cache.length, [5, 5])


def test_decode_in_scan_matches_full(tiny_lm, tiny_params):
    lm, params = tiny_lm, tiny_params
    B, steps = 2, 8
    seq = _tokens(14, (B, steps), lm.vocab_size)

    @jax.jit
    def decode(params, seq):
        def body(cache, tok):
            logits, cache = lm.forward(
                params, cache, tok[:, None], cache.length[:, None], causal_block_mask(B, 1)
            )
            return advance(cache, 1), logits[:, 0]

        _, logits = jax.lax.scan(body, lm.init_cache(B), seq.T)
        return logits.transpose(1, 0, 2)

    chex.assert_trees_all_close(decode(params, seq), _full(lm, params, seq), **TOL)


def test_block_longer_than_capacity_fails_before_work(tiny_lm, tiny_params):
    B, T = 1, tiny_lm.max_len + 1
    with pytest.raises(ValueError, match=r'T=33 exceeds .* max_len=32'):
        tiny_lm.forward(
            tiny_params,
            tiny_lm.init_cache(B),
            jnp.zeros((B, T), jnp.int32),
            jnp.zeros((B, T), jnp.int32),
            causal_block_mask(B, T),
        )


def test_overflowing_block_is_exact_and_never_overwrites_history(tiny_lm, tiny_params, tiny_config):
    """length + T > max_len: the block's logits stay exact, overflow slots are dropped."""
    lm, params = tiny_lm, tiny_params
    big = TransformerLM(TransformerConfig(**{**tiny_config.to_dict(), 'max_len': 64}))
    B, P, T = 1, lm.max_len - 3, 6
    seq = _tokens(15, (B, P + T), lm.vocab_size)
    _, cache = _prefill(lm, params, seq[:, :P])
    logits, new = _forward(
        lm, params, cache, seq[:, P:], _chain_positions(cache, T), causal_block_mask(B, T)
    )
    chex.assert_trees_all_close(logits, _full(big, params, seq)[:, P:], **TOL)
    for new_k, old_k in zip(new.k, cache.k):  # per layer [B, KV, hd, S]
        np.testing.assert_array_equal(new_k[..., :P], old_k[..., :P])
    for new_v, old_v in zip(new.v, cache.v):  # per layer [B, KV, S, hd]
        np.testing.assert_array_equal(new_v[:, :, :P], old_v[:, :, :P])
    assert int(advance(new, T).length[0]) == lm.max_len


@pytest.mark.parametrize(
    'overrides',
    [dict(tie_embeddings=True), dict(n_kv_heads=1), dict(dtype='bfloat16', param_dtype='bfloat16')],
)
def test_variants_decode_like_full_forward(tiny_config, overrides):
    cfg = TransformerConfig(**{**tiny_config.to_dict(), **overrides})
    lm = TransformerLM(cfg)
    params = lm.init_params(1)
    B, P = 1, 6
    seq = _tokens(16, (B, P + 1), lm.vocab_size)
    full = _full(lm, params, seq)
    _, cache = _prefill(lm, params, seq[:, :P])
    logits, _ = _forward(
        lm, params, cache, seq[:, P:], _chain_positions(cache, 1), causal_block_mask(B, 1)
    )
    assert logits.dtype == jnp.float32 and bool(jnp.isfinite(logits).all())
    # bf16 rounds differently along the two paths: compare at bf16 resolution.
    tol = dict(atol=5e-2, rtol=5e-2) if cfg.dtype == 'bfloat16' else TOL
    chex.assert_trees_all_close(logits[:, 0], full[:, P], **tol)


def test_cache_capacity_is_per_cache_and_does_not_change_logits(tiny_lm, tiny_params):
    """A cache sized to the call (capacity < max_len) scores exactly like a full-size one;
    the layout is one [B, KV, S, hd] array per layer."""
    lm, params = tiny_lm, tiny_params
    B, P, T = 2, 5, 3
    seq = _tokens(17, (B, P + T), lm.vocab_size)
    outs = []
    for cap in (None, P + T):
        cache = lm.init_cache(B, cap)
        assert len(cache.k) == lm.config.n_layers
        assert cache.k[0].shape == (B, lm.config.n_kv_heads, lm.config.head_dim, cap or lm.max_len)
        assert cache.v[0].shape == (B, lm.config.n_kv_heads, cap or lm.max_len, lm.config.head_dim)
        _, cache = _forward(
            lm, params, cache, seq[:, :P], _chain_positions(cache, P), causal_block_mask(B, P)
        )
        cache = advance(cache, P)
        logits, _ = _forward(
            lm, params, cache, seq[:, P:], _chain_positions(cache, T), causal_block_mask(B, T)
        )
        outs.append(logits)
    chex.assert_trees_all_close(outs[0], outs[1], **TOL)
    with pytest.raises(ValueError, match=r'capacity=33'):
        lm.init_cache(B, lm.max_len + 1)


def test_cache_attention_blocks_equal_one_dense_softmax():
    """The blocked cache read (online softmax over blocks, the last block's start clamped
    when the capacity is not a multiple of the block) equals one dense softmax over the
    committed slots, for rows of every length including none, under jit."""
    from specjax.models.transformer import cache_attention

    B, KV, Q, S, hd = 4, 2, 3, 10, 8  # keys are stored [B, KV, hd, S]
    ks = jax.random.split(jax.random.key(5), 3)
    q = jax.random.normal(ks[0], (B, KV, Q, hd))
    k = jax.random.normal(ks[1], (B, KV, S, hd))
    v = jax.random.normal(ks[2], (B, KV, S, hd))
    length = jnp.array([0, 1, 7, 10], jnp.int32)
    for chunk in (3, 4, 10, 64):
        m, z, o = jax.jit(
            functools.partial(cache_attention, dt=jnp.float32, chunk=chunk, min_blocks=2)
        )(q, k.transpose(0, 1, 3, 2), v, length)
        for b in range(B):
            n = int(length[b])
            if n == 0:
                np.testing.assert_array_equal(z[b], 0.0)
                np.testing.assert_array_equal(o[b], 0.0)
                continue
            s = np.einsum('kqh,ksh->kqs', q[b], k[b, :, :n])
            np.testing.assert_allclose(m[b], s.max(-1), rtol=1e-6, atol=1e-6)
            p = np.exp(s - s.max(-1, keepdims=True))
            ref = np.einsum('kqs,ksh->kqh', p / p.sum(-1, keepdims=True), v[b, :, :n])
            np.testing.assert_allclose(o[b] / z[b][..., None], ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chunk", [3, 8])
def test_blocked_cache_read_in_the_model_equals_the_full_forward(
    tiny_lm, tiny_params, monkeypatch, chunk
):
    """The model with a small cache block (several blocks per row, ragged rows, a row with
    an empty cache) scores a block exactly as the full forward does."""
    from specjax.models import transformer

    monkeypatch.setattr(transformer, "CACHE_CHUNK", chunk)
    monkeypatch.setattr(transformer, "CACHE_MIN_BLOCKS", 2)
    lm, params = tiny_lm, tiny_params
    B, P, T = 3, 13, 4
    prefix = _tokens(7, (B, P), lm.vocab_size)
    block = _tokens(8, (B, T), lm.vocab_size)
    n = jnp.array([P, P - 6, 0], jnp.int32)
    cache = lm.init_cache(B, 24)
    pos = jnp.broadcast_to(jnp.arange(P), (B, P))
    fwd = jax.jit(lambda p, c, t, ps, mk: lm.forward(p, c, t, ps, mk))  # a fresh trace
    _, cache = fwd(params, cache, prefix, pos, causal_block_mask(B, P))
    cache = advance(cache, n)
    logits, _ = fwd(
        params, cache, block, n[:, None] + jnp.arange(T)[None, :], causal_block_mask(B, T)
    )
    for b in range(B):
        seq = jnp.concatenate([prefix[b, : int(n[b])], block[b]])[None]
        chex.assert_trees_all_close(logits[b], _full(lm, params, seq)[0, int(n[b]) :], **TOL)


def test_weight_products_in_half_precision_pad_one_row_and_accumulate_in_f32(monkeypatch):
    """`project`: a one-row bf16 product is the first row of the two-row product it is
    padded to (rows are independent: the zero row changes nothing), every bf16 product is
    the f32 product of its bf16 operands rounded once to bf16 (f32 accumulation), and f32
    products are the einsum they replaced, bit for bit in shape and to f32 rounding."""
    from specjax.models import products

    rng = np.random.default_rng(0)
    K, H, hd = 96, 3, 16
    w = jnp.asarray(rng.standard_normal((K, H, hd)) * 0.1, jnp.bfloat16)
    x2 = jnp.asarray(rng.standard_normal((1, 2, K)), jnp.bfloat16)
    one = jax.jit(products.project, static_argnums=2)(x2[:, :1], w, jnp.bfloat16)
    two = jax.jit(products.project, static_argnums=2)(x2, w, jnp.bfloat16)
    assert one.shape == (1, 1, H, hd) and one.dtype == jnp.bfloat16
    np.testing.assert_array_equal(
        np.asarray(one[:, 0], np.float32), np.asarray(two[:, 0], np.float32)
    )
    exact = jnp.einsum('btd,dnh->btnh', x2.astype(jnp.float32), w.astype(jnp.float32))
    # One rounding of an f32 sum: within half a bf16 ulp (2^-8 relative) of the exact
    # product, up to the f32 summation order.
    np.testing.assert_allclose(
        np.asarray(two, np.float32), np.asarray(exact), rtol=2**-8 + 1e-5, atol=1e-6
    )
    head = products.project(x2[:, :1], w.reshape(K, -1), jnp.bfloat16, out_dtype=jnp.float32)
    assert head.dtype == jnp.float32 and head.shape == (1, 1, H * hd)
    # f32: the flat product equals the einsum; the 'einsum' form traces the einsum itself.
    x32, w32 = x2.astype(jnp.float32), w.astype(jnp.float32)
    flat = products.project(x32, w32, jnp.float32)
    monkeypatch.setattr(products, 'PRODUCTS', 'einsum')
    ein = products.project(x32, w32, jnp.float32)
    np.testing.assert_allclose(np.asarray(flat), np.asarray(exact), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(ein), np.asarray(flat), rtol=1e-5, atol=1e-6)
