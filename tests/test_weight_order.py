"""The weight order (`TransformerConfig.out_first`): projection weights stored ``[out, in]``
(as HF and GGUF keep them), the products contracting their last dims; the same function as
the default ``[in, out]`` order.

Transposing a weight changes only the form of its product, not the terms of any output
element, so f32 logits agree to f32 summation order (measured on this CPU: ≤ 3e-6 on
logits of ~1); the bound is 1e-5. Conversions and export are exact.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.models import hf, products
from specjax.models.api import TransformerLM, causal_block_mask, fuse_projections, order_weights
from specjax.models.fused import order_params, separate_leaf, unfuse_params
from specjax.models.transformer import TransformerConfig
from specjax.runtime import sharding as shd

ATOL = 1e-5


def _model(bias: bool, tie: bool = False, seed: int = 0):
    cfg = TransformerConfig(
        vocab_size=80,
        d_model=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        d_ff=96,
        max_len=64,
        qkv_bias=bias,
        tie_embeddings=tie,
        embed_input_scale=False,
    )
    lm = TransformerLM(cfg)
    params = lm.init_params(seed)
    # Non-zero biases and distinct tables, so a misplaced axis shows.
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
    leaves = [x + 0.05 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
    return lm, jax.tree.unflatten(tree, leaves)


def _cached_logits(m, p, tokens):
    cache = m.init_cache(2, 32)
    pos = jnp.broadcast_to(jnp.arange(8), (2, 8))
    _, cache = m.forward(p, cache, tokens[:, :8], pos, causal_block_mask(2, 8))
    cache = m.advance(cache, jnp.full((2,), 8, jnp.int32))
    pos = jnp.broadcast_to(jnp.arange(8, 11), (2, 3))
    logits, _ = m.forward(p, cache, tokens[:, 8:11], pos, causal_block_mask(2, 3))
    return np.asarray(logits)


@pytest.mark.parametrize(
    "bias,tie,fused", [(False, False, False), (True, True, False), (True, False, True)]
)
@pytest.mark.slow  # CI time (make test ≤ 15 min on a cold clone); `make test-all` runs it
def test_out_first_logits_equal_the_default_order_prefill_and_cached_decode(bias, tie, fused):
    lm, params = _model(bias, tie)
    if fused:
        lm, params = fuse_projections(lm, params)
    olm, oparams = order_weights(lm, params)
    assert olm.config.out_first and not lm.config.out_first
    assert jax.tree.structure(oparams) == jax.tree.structure(olm.abstract_params())
    for got, want in zip(jax.tree.leaves(oparams), jax.tree.leaves(olm.abstract_params())):
        assert got.shape == want.shape
    a = oparams["layer_0"]["attn"]
    if fused:
        assert a["wqkv"].shape == (2, 4, 16, 64)  # [KV, G+2, hd, D]
    else:
        assert a["wq"].shape == (4, 16, 64) and a["wk"].shape == (2, 16, 64)
    assert a["wo"].shape == (64, 4, 16)
    assert ("lm_head" in oparams) == (not tie)
    if not tie:
        assert oparams["lm_head"].shape == (80, 64)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 80, (2, 12)))
    np.testing.assert_allclose(
        olm.logits_full(oparams, tokens), lm.logits_full(params, tokens), rtol=0, atol=ATOL
    )
    np.testing.assert_allclose(
        _cached_logits(olm, oparams, tokens), _cached_logits(lm, params, tokens), rtol=0, atol=ATOL
    )


@pytest.mark.parametrize("fused", [False, True])
def test_ordering_back_inverts_it_exactly_and_leaves_read_back_in_the_default_order(fused):
    lm, params = _model(True, seed=3)
    if fused:
        lm, params = fuse_projections(lm, params)
    ocfg = dataclasses.replace(lm.config, out_first=True)
    oparams = order_params(lm.config, params, True)
    back = order_params(ocfg, oparams, False)
    assert jax.tree.structure(back) == jax.tree.structure(params)
    jax.tree.map(np.testing.assert_array_equal, back, params)
    for path in [("layer_1", "attn", "wk"), ("layer_0", "attn", "wo"), ("layer_1", "mlp", "w_up")]:
        np.testing.assert_array_equal(
            separate_leaf(ocfg, oparams, path), separate_leaf(lm.config, params, path)
        )
    if fused:  # unfusing an out-first model keeps it out first
        sep = unfuse_params(ocfg, oparams)
        np.testing.assert_array_equal(
            sep["layer_0"]["attn"]["wq"],
            jnp.transpose(separate_leaf(lm.config, params, ("layer_0", "attn", "wq")), (1, 2, 0)),
        )


def test_export_of_an_out_first_model_writes_the_default_checkpoint(tmp_path):
    lm, params = _model(True, seed=5)
    olm, oparams = order_weights(lm, params)
    flm, fparams = fuse_projections(olm, oparams)
    a = hf.save_hf(tmp_path / "default", lm, params, family="qwen2")
    b = hf.save_hf(tmp_path / "out_first", olm, oparams, family="qwen2")
    c = hf.save_hf(tmp_path / "fused_out_first", flm, fparams, family="qwen2")
    for f in sorted(p.name for p in a.iterdir()):
        assert (a / f).read_bytes() == (b / f).read_bytes() == (c / f).read_bytes(), f


def test_out_first_tables_shard_by_their_logical_axes_on_a_mesh():
    lm, params = _model(False, seed=7)
    mesh = shd.make_mesh(4, 2)
    sharded = shd.shard_lm_params(lm, params, mesh)
    olm, oparams = order_weights(lm, sharded, True, mesh)
    ref = sharded["layer_0"]["attn"]["wq"].sharding.spec  # [D, H, hd]
    wq = oparams["layer_0"]["attn"]["wq"]  # [H, hd, D]: the same axes, moved
    assert wq.sharding.spec == jax.sharding.PartitionSpec(*(tuple(ref)[1:] + tuple(ref)[:1]))
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, 80, (4, 10)))
    np.testing.assert_allclose(
        olm.logits_full(oparams, tokens), lm.logits_full(params, tokens), atol=1e-5, rtol=1e-5
    )


def test_out_first_bf16_product_is_the_f32_product_of_its_operands_rounded_once():
    rng = np.random.default_rng(2)
    K, H, hd = 96, 3, 16
    w = jnp.asarray(rng.standard_normal((H, hd, K)) * 0.1, jnp.bfloat16)  # [*out, *in]
    x = jnp.asarray(rng.standard_normal((1, 2, K)), jnp.bfloat16)
    project = jax.jit(products.project, static_argnums=(2, 3, 4))
    two = project(x, w, jnp.bfloat16, None, True)
    one = project(x[:, :1], w, jnp.bfloat16, None, True)
    assert two.shape == (1, 2, H, hd) and two.dtype == jnp.bfloat16
    np.testing.assert_array_equal(
        np.asarray(one[:, 0], np.float32), np.asarray(two[:, 0], np.float32)
    )
    exact = jnp.einsum("btd,nhd->btnh", x.astype(jnp.float32), w.astype(jnp.float32))
    np.testing.assert_allclose(
        np.asarray(two, np.float32), np.asarray(exact), rtol=2**-8 + 1e-5, atol=1e-6
    )


def test_bad_order_inputs_fail_with_one_line():
    with pytest.raises(ValueError, match="out_first"):
        TransformerConfig(out_first="yes")
    lm, params = _model(False)
    olm, oparams = order_weights(lm, params)
    with pytest.raises(ValueError, match="out_first=True already"):
        order_params(olm.config, oparams, True)
    with pytest.raises(ValueError, match="out_first=False already"):
        order_params(lm.config, params, False)
    assert "out_first" not in lm.config.to_dict()  # older manifests unchanged
    assert olm.config.to_dict()["out_first"] is True
    assert TransformerConfig.from_dict(olm.config.to_dict()) == olm.config
