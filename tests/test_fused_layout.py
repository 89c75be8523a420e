"""The fused projection layout (`TransformerConfig.fused_projections`): q/k/v in one table
and gate/up in one, the same function as the separate layout.

Fusing only moves weights between tables; each output element is the same dot product
over the same d_model terms, so the logits are compared exactly (XLA may order a wider
product's inner loop differently; measured: identical on this CPU), with a 1e-6 fallback
bound only where the products differ in shape.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.models import hf
from specjax.models.api import TransformerLM, causal_block_mask, fuse_projections
from specjax.models.fused import fuse_params, separate_leaf, unfuse_params
from specjax.models.transformer import TransformerConfig
from specjax.runtime import sharding as shd

ATOL = 1e-6


def _model(bias: bool, seed: int = 0):
    cfg = TransformerConfig(
        vocab_size=80,
        d_model=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        d_ff=96,
        max_len=64,
        qkv_bias=bias,
        tie_embeddings=False,
    )
    lm = TransformerLM(cfg)
    params = lm.init_params(seed)
    # Non-zero biases and distinct tables, so a swapped or misplaced slice shows.
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
    leaves = [x + 0.05 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
    return lm, jax.tree.unflatten(tree, leaves)


@pytest.mark.slow  # CI time (make test ≤ 15 min on a cold clone); `make test-all` runs it
@pytest.mark.parametrize("bias", [False, True])
def test_fused_logits_equal_separate_prefill_and_cached_decode(bias):
    lm, params = _model(bias)
    flm, fparams = fuse_projections(lm, params)
    assert flm.config.fused_projections and not lm.config.fused_projections
    assert jax.tree.structure(fparams) == jax.tree.structure(flm.abstract_params())
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 80, (2, 12)))
    np.testing.assert_allclose(
        flm.logits_full(fparams, tokens), lm.logits_full(params, tokens), rtol=0, atol=ATOL
    )
    # Cached: prefill 8 tokens, then a 3-token block over the cache.
    outs = []
    for m, p in ((lm, params), (flm, fparams)):
        cache = m.init_cache(2, 32)
        pos = jnp.broadcast_to(jnp.arange(8), (2, 8))
        _, cache = m.forward(p, cache, tokens[:, :8], pos, causal_block_mask(2, 8))
        cache = m.advance(cache, jnp.full((2,), 8, jnp.int32))
        pos = jnp.broadcast_to(jnp.arange(8, 11), (2, 3))
        logits, _ = m.forward(p, cache, tokens[:, 8:11], pos, causal_block_mask(2, 3))
        outs.append(np.asarray(logits))
    np.testing.assert_allclose(outs[1], outs[0], rtol=0, atol=ATOL)


@pytest.mark.parametrize("bias", [False, True])
def test_unfuse_inverts_fuse_exactly(bias):
    lm, params = _model(bias, seed=3)
    fcfg = dataclasses.replace(lm.config, fused_projections=True)
    fparams = fuse_params(lm.config, params)
    back = unfuse_params(fcfg, fparams)
    assert jax.tree.structure(back) == jax.tree.structure(params)
    jax.tree.map(np.testing.assert_array_equal, back, params)
    # Each separate leaf is read back from the fused tables, e.g. KV head 1's key.
    np.testing.assert_array_equal(
        separate_leaf(fcfg, fparams, ("layer_1", "attn", "wk")), params["layer_1"]["attn"]["wk"]
    )
    np.testing.assert_array_equal(
        separate_leaf(fcfg, fparams, ("layer_0", "mlp", "w_up")), params["layer_0"]["mlp"]["w_up"]
    )


def test_export_of_a_fused_model_writes_the_separate_checkpoint(tmp_path):
    lm, params = _model(True, seed=5)
    flm, fparams = fuse_projections(lm, params)
    a = hf.save_hf(tmp_path / "separate", lm, params, family="qwen2")
    b = hf.save_hf(tmp_path / "fused", flm, fparams, family="qwen2")
    for f in sorted(p.name for p in a.iterdir()):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f


def test_fused_tables_shard_over_kv_heads_on_a_mesh():
    lm, params = _model(False, seed=7)
    mesh = shd.make_mesh(4, 2)
    sharded = shd.shard_lm_params(lm, params, mesh)
    flm, fparams = fuse_projections(lm, sharded, mesh)
    wqkv = fparams["layer_0"]["attn"]["wqkv"]
    assert wqkv.sharding.spec == jax.sharding.PartitionSpec(None, "model", None, None)
    assert wqkv.addressable_shards[0].data.shape == (64, 1, 4, 16)
    gu = fparams["layer_0"]["mlp"]["w_gate_up"]
    assert gu.sharding.spec == jax.sharding.PartitionSpec(None, None, "model")
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, 80, (4, 10)))
    # On a mesh XLA partitions the fused and the separate products differently (measured:
    # up to 1.7e-6 on logits of ~1, 14 f32 ulps), so the bound is tests/test_sharding.py's
    # for sharded against unsharded forwards.
    np.testing.assert_allclose(
        flm.logits_full(fparams, tokens), lm.logits_full(params, tokens), atol=1e-5, rtol=1e-5
    )


def test_bad_layout_inputs_fail_with_one_line():
    with pytest.raises(ValueError, match="fused_projections"):
        TransformerConfig(fused_projections=1)
    lm, params = _model(False)
    flm, fparams = fuse_projections(lm, params)
    with pytest.raises(ValueError, match="fused_projections=True already"):
        fuse_params(flm.config, fparams)
    with pytest.raises(ValueError, match="fused_projections=False"):
        unfuse_params(lm.config, params)
    assert "fused_projections" not in lm.config.to_dict()  # older manifests unchanged
    assert flm.config.to_dict()["fused_projections"] is True
    assert TransformerConfig.from_dict(flm.config.to_dict()) == flm.config
