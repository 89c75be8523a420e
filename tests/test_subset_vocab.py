"""FR-Spec subset-vocabulary drafters (`specjax.models.subset_vocab.SubsetVocabLM`): the model.

Forward logits are the inner transformer's logits scattered into the verifier's ids
(NEG_LOGIT elsewhere), so after `sampling_probs` every id outside `keep` has probability
exactly 0 at every temperature and under top-k / top-p, and the "other" row is never
proposed; `maps` validation; the cache helpers delegate to the inner model's;
`logits_full` equals a cached forward (ragged prefill + one-token steps); the drafter's
own-ids form (`drafting_maps`, as its kind drafts) gives the same q. Losslessness through the engine:
tests/test_subset_vocab_engine.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from lossless_reference import reference_probs

from specjax.engine.spec import drafting_maps
from specjax.models import cache as cache_mod
from specjax.models.api import TransformerLM, causal_block_mask
from specjax.models.subset_vocab import NEG_LOGIT, SubsetVocabLM, most_frequent_ids
from specjax.models.transformer import TransformerConfig
from specjax.verify.distributions import sampling_probs

V = 40  # the verifier vocabulary of the model tests
KEEP = np.array([0, 3, 4, 7, 11, 12, 20, 21, 29, 33, 38], np.int32)  # K = 11
INNER = TransformerConfig(
    vocab_size=len(KEEP) + 1, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=32, max_len=32
)


@pytest.fixture(scope="module")
def model():
    lm = SubsetVocabLM(INNER, V)
    params = lm.init_params(3, KEEP)
    # Larger inner logits (sharper q) than the init's, so that temperature / top-k / top-p
    # make a difference.
    params["inner"]["lm_head"] = params["inner"]["lm_head"] * 6.0
    return lm, params


def _outside(keep=KEEP, v=V):
    out = np.ones(v, bool)
    out[keep] = False
    return out


def _scatter_ref(inner_logits, keep=KEEP, v=V):
    """NumPy: inner logits [..., K+1] -> verifier logits [..., V] (NEG_LOGIT elsewhere)."""
    x = np.asarray(inner_logits, np.float32)
    out = np.full(x.shape[:-1] + (v,), NEG_LOGIT, np.float32)
    out[..., keep] = x[..., : len(keep)]
    return out


# ----------------------------------------------------------------------------------------
# 1. The model
# ----------------------------------------------------------------------------------------


def test_maps_and_static_facts(model):
    lm, params = model
    assert (lm.vocab_size, lm.n_kept, lm.max_len) == (V, len(KEEP), INNER.max_len)
    to_inner = np.asarray(params["to_inner"])
    assert to_inner.dtype == np.int32 and to_inner.shape == (V,)
    np.testing.assert_array_equal(to_inner[KEEP], np.arange(len(KEEP)))
    assert (to_inner[_outside()] == len(KEEP)).all()  # the "other" row
    np.testing.assert_array_equal(params["keep"], KEEP)
    # Equality and hash are the config's and V's (one compiled program per shape).
    assert lm == SubsetVocabLM(INNER, V) and hash(lm) == hash(SubsetVocabLM(INNER, V))
    assert lm != SubsetVocabLM(INNER, V + 1)
    assert isinstance(lm.inner, TransformerLM) and lm.inner.config == INNER
    # Abstract params / logical axes describe init_params' tree.
    abstract = lm.abstract_params()
    assert jax.tree.structure(abstract) == jax.tree.structure(params)
    for a, p in zip(jax.tree.leaves(abstract), jax.tree.leaves(params)):
        assert (a.shape, a.dtype) == (p.shape, p.dtype)
    axes = lm.param_logical_axes()
    assert axes["to_inner"] == (None,) and axes["keep"] == (None,)
    assert axes["inner"] == lm.inner.param_logical_axes()


def test_maps_validation():
    lm = SubsetVocabLM(INNER, V)
    k = len(KEEP)
    with pytest.raises(ValueError, match="distinct"):
        lm.maps(KEEP[:-1])  # too few
    with pytest.raises(ValueError, match="distinct"):
        lm.maps(np.append(KEEP, 1))  # too many
    with pytest.raises(ValueError, match="distinct"):
        lm.maps(np.concatenate([KEEP[:-1], KEEP[:1]]))  # a duplicate
    with pytest.raises(ValueError, match="distinct"):
        lm.maps(KEEP.reshape(1, k))  # not 1-D
    with pytest.raises(ValueError, match=r"\[0, 40\)"):
        lm.maps(np.append(KEEP[:-1], V))  # id >= V
    with pytest.raises(ValueError, match=r"\[0, 40\)"):
        lm.maps(np.append(KEEP[1:], -1))  # negative id
    with pytest.raises(ValueError, match="K \\+ 1 >= 2"):
        SubsetVocabLM(TransformerConfig(vocab_size=1, d_model=16, n_heads=2, n_kv_heads=1), V)
    with pytest.raises(ValueError, match="exceed"):
        SubsetVocabLM(TransformerConfig(vocab_size=V + 2, d_model=16, n_heads=2, n_kv_heads=1), V)
    # K = V (every id kept) is allowed; so is any order of `keep`.
    full = SubsetVocabLM(
        TransformerConfig(vocab_size=V + 1, d_model=16, n_heads=2, n_kv_heads=1), V
    )
    m = full.maps(np.arange(V)[::-1])
    np.testing.assert_array_equal(m["to_inner"], np.arange(V)[::-1])
    shuffled = lm.maps(KEEP[::-1])
    np.testing.assert_array_equal(np.asarray(shuffled["to_inner"])[KEEP[::-1]], np.arange(k))


def test_most_frequent_ids():
    counts = np.array([5, 9, 9, 0, 7, 1, 9, 3])
    np.testing.assert_array_equal(most_frequent_ids(counts, 3), [1, 2, 6])  # ties by id
    np.testing.assert_array_equal(most_frequent_ids(counts, 4), [1, 2, 4, 6])
    np.testing.assert_array_equal(most_frequent_ids(counts, 3, always=(3,)), [1, 2, 3])
    np.testing.assert_array_equal(most_frequent_ids(counts, 8), np.arange(8))
    assert most_frequent_ids(counts, 2).dtype == np.int32
    for k in (0, 9):
        with pytest.raises(ValueError, match="k="):
            most_frequent_ids(counts, k)
    np.testing.assert_array_equal(counts, [5, 9, 9, 0, 7, 1, 9, 3])  # input untouched


# One block shape for the cached forwards of these tests (B rows, a prefill of W tokens
# or a one-token step, capacity C), so that they share two compiled programs.
B, W, C, TOTAL = 4, 8, 16, 14


@pytest.fixture(scope="module")
def fwd(model):
    lm, _ = model
    return jax.jit(
        lambda params, cache, tokens, positions: lm.forward(
            params, cache, tokens, positions, causal_block_mask(*tokens.shape)
        )
    )


@pytest.fixture(scope="module")
def full(model):
    """Random ragged sequences, their verifier-space and inner logits over the whole
    sequences (`logits_full`, `inner_logits_full`)."""
    lm, params = model
    rng = np.random.default_rng(1)
    seqs = rng.integers(0, V, (B, TOTAL)).astype(np.int32)
    seqs[0, 1:4] = [1, 2, 5]  # ids outside the subset as inputs
    both = jax.jit(lambda p, t: (lm.logits_full(p, t), lm.inner_logits_full(p, t)))
    logits, inner = jax.device_get(both(params, jnp.asarray(seqs)))
    return seqs, logits, inner


def _prefill(lm, params, fwd, prompt):
    pos = np.broadcast_to(np.arange(W, dtype=np.int32), (B, W))
    return fwd(params, lm.init_cache(B, C), jnp.asarray(prompt), jnp.asarray(pos))


def test_forward_is_the_inner_model_scattered(model, fwd, full):
    """`logits_full` is the inner model's logits scattered (NEG_LOGIT off the subset), a
    cached forward equals it, and every id outside the subset reads the "other" row."""
    lm, params = model
    seqs, logits_full, inner = full
    assert logits_full.dtype == np.float32 and logits_full.shape == (B, TOTAL, V)
    assert inner.shape == (B, TOTAL, len(KEEP) + 1)
    np.testing.assert_allclose(logits_full, _scatter_ref(inner), rtol=1e-5, atol=1e-5)
    assert (logits_full[..., _outside()] == NEG_LOGIT).all()
    logits, cache = _prefill(lm, params, fwd, seqs[:, :W])
    assert logits.dtype == jnp.float32 and logits.shape == (B, W, V)
    np.testing.assert_allclose(logits, logits_full[:, :W], rtol=1e-4, atol=1e-4)
    assert (np.asarray(logits)[..., _outside()] == NEG_LOGIT).all()
    assert (np.asarray(cache.length) == 0).all()  # forward does not commit
    # The inner model saw `to_inner` of the tokens: any other id outside the subset gives
    # the same logits.
    rng = np.random.default_rng(5)
    other = seqs[:, :W].copy()
    mask = _outside()[other]
    other[mask] = rng.choice(np.nonzero(_outside())[0], int(mask.sum()))
    assert (other != seqs[:, :W]).any()
    np.testing.assert_array_equal(_prefill(lm, params, fwd, other)[0], logits)


def test_logits_full_equals_a_cached_forward(model, fwd, full):
    """Ragged rows: a prefill of each row's prompt (right-padded), then one-token steps at
    per-row cache lengths, against `logits_full` of the whole sequences."""
    lm, params = model
    seqs, logits_full, _ = full
    plen = np.array([3, 8, 1, 5], np.int32)
    prompt = np.where(np.arange(W)[None] < plen[:, None], seqs[:, :W], 0)
    logits, cache = _prefill(lm, params, fwd, prompt)
    logits = np.asarray(logits)
    for r in range(B):
        np.testing.assert_allclose(
            logits[r, : plen[r]], logits_full[r, : plen[r]], rtol=1e-4, atol=1e-4
        )
    cache = lm.advance(cache, jnp.asarray(plen))
    for _ in range(TOTAL - W):
        ln = np.asarray(cache.length)
        tok = seqs[np.arange(B), ln][:, None]
        step, cache = fwd(params, cache, jnp.asarray(tok), jnp.asarray(ln[:, None]))
        cache = lm.advance(cache, jnp.ones((B,), jnp.int32))
        np.testing.assert_allclose(
            np.asarray(step)[:, 0], logits_full[np.arange(B), ln], rtol=1e-4, atol=1e-4
        )
        assert (np.asarray(step)[:, 0, _outside()] == NEG_LOGIT).all()


TAUS = (0.0, 1e-3, 0.3, 0.7, 1.0, 1.5, 2.0, 10.0)
FILTERS = ((0, 1.0), (3, 1.0), (len(KEEP), 1.0), (len(KEEP) + 5, 1.0), (0, 0.9), (4, 0.8))


def test_probability_zero_outside_the_subset(model, full):
    """`sampling_probs` of the drafter's logits at the engine's temperatures and filters:
    exactly 0 off the subset, and the law of the kept ids alone (an independent float64
    reference over the inner logits without the "other" row)."""
    _, logits, inner = full
    inner = inner[..., : len(KEEP)]
    out = _outside()

    @jax.jit
    def probs(x):
        taus = jnp.asarray(TAUS, jnp.float32)
        return jnp.stack(
            [
                jax.vmap(lambda t, k=k, p=p: sampling_probs(x, t, top_k=k, top_p=p))(taus)
                for k, p in FILTERS
            ]
        )

    qs = np.asarray(probs(jnp.asarray(logits)))
    for i, (k, p) in enumerate(FILTERS):
        for j, tau in enumerate(TAUS):
            q = qs[i, j]
            assert (q[..., out] == 0).all(), (tau, k, p)
            np.testing.assert_allclose(q.sum(-1), 1.0, atol=1e-5)
            ref = reference_probs(
                inner, float(np.float32(tau)), k if k <= len(KEEP) else 0, p if tau > 0 else 1.0
            )
            np.testing.assert_allclose(
                q[..., KEEP], ref, atol=2e-5, err_msg=f"tau={tau} top_k={k} top_p={p}"
            )


def test_the_other_row_is_never_proposed(model):
    """Inner logits where the "other" row dominates: the scattered law ignores it (greedy,
    sampled, top-k) and samples only ever hit kept ids."""
    lm, params = model
    k = len(KEEP)
    rng = np.random.default_rng(3)
    inner = rng.normal(size=(64, k + 1)).astype(np.float32)
    inner[:, k] = 50.0  # by far the largest logit
    settings = ((0.0, 0), (1.0, 0), (1.0, 2), (5.0, 0))

    @jax.jit
    def run(params, inner):
        logits = lm.scatter(params, inner)
        qs = [sampling_probs(logits, t, top_k=kk) for t, kk in settings]
        draws = jax.random.categorical(jax.random.key(0), logits, shape=(200, 64))
        return logits, qs, draws, lm.scatter(params, inner.astype(jnp.bfloat16))

    logits, qs, draws, from_bf16 = jax.device_get(run(params, jnp.asarray(inner)))
    np.testing.assert_array_equal(logits, _scatter_ref(inner))
    for (tau, top_k), q in zip(settings, qs):
        assert (q[:, _outside()] == 0).all()
        np.testing.assert_allclose(q[:, KEEP], reference_probs(inner[:, :k], tau, top_k), atol=1e-5)
    assert np.isin(draws, KEEP).all()
    assert from_bf16.dtype == np.float32  # bf16 inner logits scatter as f32


@pytest.mark.parametrize(
    "temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 3, 1.0), (1.3, 0, 0.8), (0.0, 0, 1.0)]
)
def test_own_ids_form_has_the_same_q(model, full, temperature, top_k, top_p):
    """`drafting_maps` (its kind's `Drafting`): the inner model's distribution over its own ids, masked where
    `to_verifier` is -1 and moved into the verifier's ids, is the `SubsetVocabLM`'s; every
    verifier id is one piece (its inner id or "other")."""
    from specjax.verify.distributions import to_verifier_space

    lm, params = model
    inner_lm, data = drafting_maps(lm, params, lm.verifier_vocab)
    assert inner_lm is lm.inner and not data.identity
    to_v = np.asarray(data.to_verifier)
    np.testing.assert_array_equal(to_v, np.concatenate([KEEP, [-1]]))
    np.testing.assert_array_equal(np.asarray(data.from_verifier), np.asarray(params["to_inner"]))
    np.testing.assert_array_equal(np.asarray(data.retok)[:, 0], np.asarray(params["to_inner"]))
    assert (np.asarray(data.retok_len) == 1).all() and data.retok.shape == (V, 1)
    _, logits_full, inner = full
    want = sampling_probs(jnp.asarray(logits_full), temperature, top_k=top_k, top_p=top_p)
    q_d = sampling_probs(
        jnp.asarray(inner), temperature, top_k=top_k, top_p=top_p, mask=data.to_verifier >= 0
    )
    got = to_verifier_space(q_d, data.to_verifier, V)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert (np.asarray(q_d)[..., -1] == 0).all()  # "other" is never drawn


def test_cache_helpers_delegate(model, fwd):
    lm, params = model
    c0 = lm.init_cache(B, C)
    ref0 = lm.inner.init_cache(B, C)
    assert type(c0) is type(ref0) and jax.tree.structure(c0) == jax.tree.structure(ref0)
    for a, r in zip(jax.tree.leaves(c0), jax.tree.leaves(ref0)):
        assert a.shape == r.shape and a.dtype == r.dtype
    assert lm.init_cache(2).k[0].shape[-1] == INNER.max_len  # default capacity
    with pytest.raises(ValueError, match="capacity"):
        lm.init_cache(1, INNER.max_len + 1)
    toks = np.random.default_rng(4).integers(0, V, (B, W)).astype(np.int32)
    _, c = _prefill(lm, params, fwd, toks)
    n = jnp.asarray([2, 6, 0, 8], jnp.int32)
    src = jnp.asarray([[1, 0], [3, 2], [0, 1], [4, 5]], jnp.int32)
    m = jnp.asarray([2, 1, 0, 2], jnp.int32)

    @jax.jit
    def both(c):
        return [
            (lm.advance(c, n), cache_mod.advance(c, n)),
            (lm.rollback(lm.advance(c, 6), n), cache_mod.rollback(cache_mod.advance(c, 6), n)),
            (
                lm.compact(lm.advance(c, 1), src, m),
                cache_mod.compact(cache_mod.advance(c, 1), src, m),
            ),
        ]

    pairs = both(c)
    for got, want in pairs:
        for a, r in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_array_equal(a, r)
    assert np.asarray(pairs[0][0].length).tolist() == [2, 6, 0, 8]
    assert np.asarray(pairs[2][0].length).tolist() == [3, 2, 1, 3]
