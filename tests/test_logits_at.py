"""`logits_at`: a forward's head on some block positions only (`specjax.models.api.forward_rows`).

Prefills, a drafter's consume of committed tokens and the KL check read one or a few rows of
a block's logits; every LM kind runs its head on those rows alone. Each must equal the same
rows of its full forward (bit for bit where the rows' products are the same), the cache it
returns must be the same, and an LM whose forward does not take ``logits_at`` is sliced.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.engine.prefill import prefill_cache
from specjax.models.api import TransformerLM, causal_block_mask, forward_rows, takes_logits_at
from specjax.models.eagle import EagleLM, eagle_config
from specjax.models.ngram import PromptLookupLM
from specjax.models.subset_vocab import SubsetVocabLM
from specjax.models.synthetic import BigramLM, random_table
from specjax.models.transformer import TransformerConfig

V, B, T = 37, 3, 9
CFG = TransformerConfig(
    vocab_size=V, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=32, max_len=32
)
TIED = dataclasses.replace(CFG, tie_embeddings=True, embed_input_scale=False)
KEEP = np.array([0, 2, 3, 5, 8, 13, 21, 34], np.int32)


def _models():
    """(name, lm, params, cache factory) for every LM kind the engine drives."""
    out = []
    for name, cfg in (
        ("transformer", CFG),
        ("tied", TIED),
        ("out_first", dataclasses.replace(CFG, out_first=True)),
    ):
        lm = TransformerLM(cfg)
        out.append((name, lm, lm.init_params(1), lambda lm=lm: lm.init_cache(B, 32)))
    sub = SubsetVocabLM(dataclasses.replace(CFG, vocab_size=len(KEEP) + 1), V)
    out.append(("subset_vocab", sub, sub.init_params(2, KEEP), lambda: sub.init_cache(B, 32)))
    v_lm = TransformerLM(TIED)
    v_params = v_lm.init_params(3)
    eagle = EagleLM(eagle_config(TIED, len(KEEP)), V)
    e_params = eagle.attach(eagle.init_net(4), v_params["embed"], KEEP)
    out.append(("eagle", eagle, e_params, lambda: eagle.init_cache(B, 32)))
    look = PromptLookupLM(vocab_size=V, max_len=32)
    out.append(("lookup", look, {}, lambda: look.init_cache(B, 32)))
    big = BigramLM(vocab_size=V)
    table = random_table(np.random.default_rng(5), V)
    out.append(("bigram", big, {"table": jnp.asarray(table)}, lambda: big.init_cache(B)))
    return out


MODELS = _models()


def _block(seed=0):
    rng = np.random.default_rng(seed)
    tokens = jnp.asarray(rng.integers(0, V, (B, T)), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    at = jnp.asarray([[T - 1, 0], [3, 3], [5, 8]], jnp.int32)  # repeats and any order
    return tokens, positions, causal_block_mask(B, T), at


@pytest.mark.parametrize("name,lm,params,fresh", MODELS, ids=[m[0] for m in MODELS])
def test_rows_equal_the_full_forward(name, lm, params, fresh):
    assert takes_logits_at(lm.forward), name
    tokens, positions, mask, at = _block()
    full, c_full = lm.forward(params, fresh(), tokens, positions, mask)
    rows, c_rows = forward_rows(lm, params, fresh(), tokens, positions, mask, at)
    want = np.take_along_axis(np.asarray(full), np.asarray(at)[:, :, None], axis=1)
    assert rows.shape == (B, at.shape[1], V) and rows.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(rows), want, rtol=1e-6, atol=1e-6)
    for a, b in zip(jax.tree.leaves(c_full), jax.tree.leaves(c_rows)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_forward_hidden_keeps_every_hidden_row():
    lm = TransformerLM(TIED)
    params = lm.init_params(6)
    tokens, positions, mask, at = _block(1)
    full, hid, _ = lm.forward_hidden(params, lm.init_cache(B, 32), tokens, positions, mask)
    rows, hid_rows, _ = forward_rows(
        lm, params, lm.init_cache(B, 32), tokens, positions, mask, at, with_hidden=True
    )
    np.testing.assert_array_equal(np.asarray(hid_rows), np.asarray(hid))
    want = np.take_along_axis(np.asarray(full), np.asarray(at)[:, :, None], axis=1)
    np.testing.assert_allclose(np.asarray(rows), want, rtol=1e-6, atol=1e-6)


@dataclasses.dataclass(frozen=True)
class _PlainLM:
    """An LM whose forward has only the protocol's five arguments (a user's model)."""

    inner: TransformerLM

    def forward(self, params, cache, tokens, positions, block_mask):
        return self.inner.forward(params, cache, tokens, positions, block_mask)


def test_an_lm_without_logits_at_is_sliced():
    inner = TransformerLM(CFG)
    params = inner.init_params(7)
    plain = _PlainLM(inner)
    assert not takes_logits_at(plain.forward)
    tokens, positions, mask, at = _block(2)
    got, _ = forward_rows(plain, params, inner.init_cache(B, 32), tokens, positions, mask, at)
    want, _ = forward_rows(inner, params, inner.init_cache(B, 32), tokens, positions, mask, at)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)


def test_prefill_returns_the_last_cached_tokens_logits():
    lm = TransformerLM(CFG)
    params = lm.init_params(8)
    tokens, positions, mask, _ = _block(3)
    n = jnp.asarray([T, 4, 1], jnp.int32)
    cache, last = prefill_cache(lm, params, tokens, n, 32)
    full, _ = lm.forward(params, lm.init_cache(B, 32), tokens, positions, mask)
    want = np.asarray(full)[np.arange(B), np.asarray(n) - 1]
    np.testing.assert_allclose(np.asarray(last), want, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(cache.length), np.asarray(n))
