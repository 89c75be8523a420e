"""The pieces of TPU planning that need no TPU compiler: tracing for a target, the served
form of a model (KV heads repeated, the head untied: the same logits), decode rules, and
reading collectives and relayouts off optimized HLO text."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.models import cache as cache_mod
from specjax.models.api import TransformerConfig, TransformerLM, causal_block_mask
from specjax.models.kv_heads import kv_repeat_for, repeat_kv_heads
from specjax.runtime import backend
from specjax.runtime import sharding as shd
from specjax.tpu.aot import hlo_ops, shape_bytes


def _lm(**kw):
    base = dict(vocab_size=64, d_model=64, n_layers=2, n_heads=8, n_kv_heads=2, d_ff=96, max_len=32)
    return TransformerLM(TransformerConfig(**{**base, **kw}))


def _logits(lm, params, T=6):
    """One jitted program per model (op by op, a forward compiles each op: ~5× slower)."""
    tok = jnp.array([[1, 5, 7, 9, 3, 11][:T]], jnp.int32)
    pos = jnp.arange(T)[None]
    mask = causal_block_mask(1, T)
    out, _ = jax.jit(lambda p: lm.forward(p, lm.init_cache(1), tok, pos, mask))(params)
    return np.asarray(out)


@pytest.mark.parametrize(
    "kw", [{}, {"out_first": True}, {"qkv_bias": True}, {"fused_projections": True}]
)
def test_repeated_kv_heads_give_the_same_logits(kw):
    lm = _lm(**kw)
    params = lm.init_params(0)
    params = jax.tree.map(
        lambda x: x + 0.05 * jax.random.normal(jax.random.key(3), x.shape), params
    )
    for r in (2, 4):
        lm2, p2 = repeat_kv_heads(lm, params, r)
        assert lm2.config.n_kv_heads == 2 * r
        np.testing.assert_allclose(_logits(lm2, p2), _logits(lm, params), atol=2e-5)
    with pytest.raises(ValueError, match="divisor"):
        repeat_kv_heads(lm, params, 3)


def test_kv_repeat_for_divides_the_model_axis():
    cfg = _lm().config  # 8 heads, 2 KV heads
    assert kv_repeat_for(cfg, 1) == 1 and kv_repeat_for(cfg, 2) == 1
    assert kv_repeat_for(cfg, 4) == 2 and kv_repeat_for(cfg, 8) == 4
    assert kv_repeat_for(cfg, 16) == 1  # 16 does not divide 8 query heads: left as is
    llama70 = TransformerConfig(
        vocab_size=8, d_model=8192, n_layers=1, n_heads=64, n_kv_heads=8, d_ff=8, max_len=8
    )
    assert kv_repeat_for(llama70, 16) == 2 and kv_repeat_for(llama70, 4) == 1


def test_served_form_unties_the_head_with_the_same_logits():
    from specjax.tpu.programs import serve_form

    lm = _lm(tie_embeddings=True, embed_input_scale=False)
    params = lm.init_params(1)
    lm2, p2 = serve_form(lm, params, 4)
    assert not lm2.config.tie_embeddings and lm2.config.n_kv_heads == 4
    np.testing.assert_allclose(_logits(lm2, p2), _logits(lm, params), atol=2e-5)
    abstract = serve_form(lm, lm.abstract_params(), 4)[1]
    assert jax.tree.map(lambda a: a.shape, abstract) == jax.tree.map(lambda a: a.shape, p2)


def test_tracing_for_a_target_changes_the_cpu_only_choices():
    half = jnp.dtype(jnp.bfloat16)
    assert cache_mod._as_bits(half) == (backend.platform() == "cpu")
    with backend.tracing_for("tpu"):
        assert backend.platform() == "tpu"
        assert not cache_mod._as_bits(half)
        jaxpr = jax.make_jaxpr(lambda x, w: cache_mod.half_take(w, x))(
            jnp.zeros((2,), jnp.int32), jnp.zeros((4, 3), half)
        )
        assert "bitcast_convert_type" not in str(jaxpr)
    assert backend.platform() == jax.default_backend()
    with pytest.raises(ValueError, match="allowed"):
        with backend.tracing_for("tpu5"):
            pass


def test_one_row_half_products_are_padded_on_every_platform():
    # XLA:CPU's bf16 kernels take two rows up; XLA:TPU turns a one-row product with f32
    # accumulation into a multiply-and-reduce over an f32 copy of the weight
    # (tests/test_tpu_compile.py::test_one_row_step_reads_its_weights_once).
    from specjax.models.products import project

    x = jnp.ones((1, 1, 8), jnp.bfloat16)
    w = jnp.ones((8, 4), jnp.bfloat16)
    cpu = str(jax.make_jaxpr(lambda a, b: project(a, b, jnp.bfloat16))(x, w))
    with backend.tracing_for("tpu"):
        tpu = str(jax.make_jaxpr(lambda a, b: project(a, b, jnp.bfloat16))(x, w))
    assert "pad" in cpu and "pad" in tpu
    two = jnp.ones((1, 2, 8), jnp.bfloat16)
    assert "pad" not in str(jax.make_jaxpr(lambda a, b: project(a, b, jnp.bfloat16))(two, w))


def test_decode_rules_keep_weights_in_place():
    # fsdp splits weight widths over 'data': decode leaves the batch unsplit
    for name in ("fsdp", "fsdp_tp"):
        rules = dict(shd.decode_rules(name))
        assert rules["batch"] is None and rules["embed"] == "data"
    assert shd.decode_rules("tp") == shd.DEFAULT_RULES
    assert shd.decode_rules("replicated") == shd.REPLICATED_RULES


HLO = """HloModule m, entry_computation_layout={(bf16[8,128]{1,0})->bf16[8,128]{1,0}}

%body.1 (p: (s32[], bf16[8,128])) -> (s32[], bf16[8,128]) {
  %p = (s32[], bf16[8,128]{1,0}) parameter(0)
  %x = bf16[8,128]{1,0} get-tuple-element(%p), index=1
  %ag = bf16[32,128]{1,0} all-gather(%x), dimensions={0}
  %ar-start = (bf16[8,128]{1,0}, bf16[8,128]{1,0}) all-reduce-start(%x), to_apply=%add
  %ar-done = bf16[8,128]{1,0} all-reduce-done(%ar-start)
  ROOT %t = (s32[], bf16[8,128]{1,0}) tuple(%i, %ar-done)
}

ENTRY %main (a: bf16[8,128]) -> bf16[8,128] {
  %a = bf16[8,128]{1,0} parameter(0)
  %c1 = bf16[8,128]{0,1} copy(%a)
  %c2 = bf16[8,128]{1,0:S(1)} copy(%a)
  %w = (s32[], bf16[8,128]{1,0}) while(%init), condition=%cond.1, body=%body.1
  ROOT %g = bf16[8,128]{1,0} get-tuple-element(%w), index=1
}
"""


def test_hlo_ops_reads_collectives_relayouts_and_loops():
    assert shape_bytes("bf16[8,128]{1,0}") == 2048
    assert shape_bytes("(f32[2], s32[])") == 12
    ops = hlo_ops(HLO)
    kinds = sorted((o.op, o.bytes, o.in_loop) for o in ops)
    # the relayout counts, the move into memory space S(1) does not; the async all-reduce
    # counts once, as its result
    assert kinds == [
        ("all-gather", 32 * 128 * 2, True),
        ("all-reduce", 8 * 128 * 2, True),
        ("copy", 8 * 128 * 2, False),
    ]


def test_keys_stored_slots_major_give_the_same_logits_and_commits(monkeypatch):
    """The TPU's key layout ([B, KV, S, hd], `cache.KEYS_SLOTS_MAJOR`) traced on the CPU:
    a prefill, cached decode steps, a tree block compacted to a path, logits equal."""
    from specjax.models.api import advance, compact

    lm = _lm(max_len=40)
    params = lm.init_params(2)

    def run():
        jax.clear_caches()
        return jax.jit(trace)(params)  # one program per layout: not op by op

    def trace(params):
        cache = lm.init_cache(2, 40)
        tok = jnp.array([[1, 5, 7, 9, 3], [2, 4, 6, 8, 10]], jnp.int32)
        out = []
        logits, cache = lm.forward(
            params, cache, tok, jnp.tile(jnp.arange(5), (2, 1)), causal_block_mask(2, 5)
        )
        out.append(logits)
        cache = advance(cache, 5)
        for t in range(3):
            step = jnp.full((2, 1), 11 + t, jnp.int32)
            logits, cache = lm.forward(
                params, cache, step, cache.length[:, None], causal_block_mask(2, 1)
            )
            out.append(logits)
            cache = advance(cache, 1)
        # a 3-node tree (root, two children), then its path root -> second child kept
        mask = jnp.array([[1, 0, 0], [1, 1, 0], [1, 0, 1]], bool)[None].repeat(2, 0)
        pos = cache.length[:, None] + jnp.array([0, 1, 1])[None]
        logits, cache = lm.forward(params, cache, jnp.full((2, 3), 13, jnp.int32), pos, mask)
        out.append(logits)
        cache = compact(cache, jnp.array([[0, 2], [0, 2]], jnp.int32), 2)
        logits, cache = lm.forward(
            params,
            cache,
            jnp.full((2, 1), 17, jnp.int32),
            cache.length[:, None],
            causal_block_mask(2, 1),
        )
        out.append(logits)
        return out, cache

    from specjax.models import transformer

    for chunk in (128, 8):  # the cache read whole, then in blocks of 8 slots
        monkeypatch.setattr(transformer, "CACHE_CHUNK", chunk)
        monkeypatch.setattr(cache_mod, "KEYS_SLOTS_MAJOR", False)
        ref, c_ref = run()
        monkeypatch.setattr(cache_mod, "KEYS_SLOTS_MAJOR", True)
        got, c_got = run()
        assert c_got.k[0].shape == c_got.v[0].shape != c_ref.k[0].shape
        assert c_got.max_len == c_ref.max_len == 40
        for a, b in zip(got, ref):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)
    jax.clear_caches()
