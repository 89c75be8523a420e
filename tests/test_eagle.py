"""Feature drafters (`specjax.models.eagle`): the model, the engine, losslessness.

1. The cache path reads what training reads: a prompt fed through `forward` (with the
   verifier's features written first) gives the logits of `hidden_full`, in one block or
   token by token; a draft step reads the drafter's own output.
2. Losslessness: χ² against the exact target law (tests/test_verify.py's harness, N =
   100,000 rows, α = 1e-3) on a tiny transformer verifier of 5 ids whose exact law over 3
   tokens is enumerated in float64 (`lossless_reference.reference_probs` on its logits);
   the drafter's head keeps 3 of the 5 ids (q = 0 on ids of positive p).
3. Greedy equality (verifier τ = 0) through the engine against autoregressive decoding;
   on the real SmolLM2 with the shipped feature drafter (slow).
"""

from __future__ import annotations

import itertools
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from lossless_reference import reference_probs
from test_real_deployment import check_greedy_cases
from test_verify import ALPHA, LENGTH, START, N, chi2_pvalue

from specjax.engine.autoregressive import autoregressive_generate
from specjax.engine.generate import row_keys_for, speculative_generate
from specjax.engine.spec import DrafterSpec, EngineConfig, feature_maps, identity_maps
from specjax.errors import ConfigError
from specjax.models.api import TransformerLM, causal_block_mask
from specjax.models.eagle import EagleLM, eagle_config, order_eagle
from specjax.models.transformer import TransformerConfig

V = 5
SMALL = TransformerConfig(
    vocab_size=V,
    d_model=8,
    n_layers=1,
    n_heads=2,
    n_kv_heads=1,
    d_ff=16,
    max_len=16,
    tie_embeddings=True,
    embed_input_scale=False,
)


def _verifier(cfg=SMALL, seed=4, sharpen=1.0):
    lm = TransformerLM(cfg)
    params = lm.init_params(seed)
    params["embed"] = params["embed"] * sharpen  # a peaked target (tied head)
    return lm, params


def _eagle(v_lm, v_params, keep, seed, scale=1.0, layers=(), depth=1):
    lm = EagleLM(eagle_config(v_lm.config, len(keep), n_layers=depth), v_lm.vocab_size, layers)
    net = lm.init_net(seed)
    net["fc"] = net["fc"] * scale
    return lm, lm.attach(net, v_params["embed"], keep)


# ----------------------------------------------------------------------------------------
# 1. The cache path
# ----------------------------------------------------------------------------------------


@pytest.mark.slow  # CI time (make test ≤ 15 min on a cold clone); `make test-all` runs it
@pytest.mark.parametrize("depth", [1, 2])
def test_forward_reads_the_features_training_reads(depth):
    """``depth``: decoder layers (EAGLE's one, or two: each with its own cache)."""
    v_lm, v_params = _verifier()
    lm, params = _eagle(v_lm, v_params, np.arange(V), seed=1, scale=3.0, depth=depth)
    assert len(lm.init_cache(2).k) == depth
    rng = np.random.default_rng(0)
    toks = jnp.asarray(rng.integers(0, V, (2, 7)), jnp.int32)
    _, feats = v_lm.hidden_full(v_params, toks)
    want = lm.head_logits(params, lm.hidden_full(params, toks, feats))  # [B, T, K]
    # One block, features of every position but the last written first.
    c = lm.write_features(lm.init_cache(2), feats, jnp.zeros(2, jnp.int32), jnp.full(2, 6))
    pos = jnp.broadcast_to(jnp.arange(7), (2, 7))
    got, c1 = lm.forward(params, c, toks, pos, causal_block_mask(2, 7))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    # Token by token.
    cc = c
    for t in range(7):
        lg, cc = lm.forward(
            params, cc, toks[:, t : t + 1], pos[:, t : t + 1], causal_block_mask(2, 1)
        )
        cc = lm.advance(cc, 1)
        np.testing.assert_allclose(lg[:, 0], want[:, t], rtol=2e-5, atol=2e-5)
    # A draft step past the verifier's features reads the drafter's own last output.
    c2 = lm.advance(c1, 7)
    nxt = jnp.zeros((2, 1), jnp.int32)
    lg, _ = lm.forward(params, c2, nxt, jnp.full((2, 1), 7), causal_block_mask(2, 1))
    own = jnp.concatenate([feats[:, :6], lm.hidden_full(params, toks, feats)[:, 6:7]], 1)
    h = lm.hidden_full(
        params, jnp.concatenate([toks, nxt], 1), jnp.concatenate([own, own[:, :1]], 1)
    )
    np.testing.assert_allclose(lg[:, 0], lm.head_logits(params, h)[:, 7], rtol=2e-5, atol=2e-5)
    # Ids outside the head have probability exactly 0.
    _, p2 = _eagle(v_lm, v_params, np.array([0, 2, 3]), seed=1)
    lg3, _ = EagleLM(eagle_config(v_lm.config, 3), V).forward(
        p2, c, toks, pos, causal_block_mask(2, 7)
    )
    assert float(jnp.max(jax.nn.softmax(lg3, -1)[..., np.array([1, 4])])) == 0.0


def test_multi_layer_features_read_what_training_reads():
    """A drafter reading several verifier states (EAGLE-3: ``feature_layers``): the
    verifier's `forward_hidden(layers=...)` gives the states `hidden_full` does, and the
    cache path (states written, then a block or token by token, then a draft step on its
    own output) gives the logits of the teacher-forced path."""
    cfg = TransformerConfig(**{**SMALL.to_dict(), "n_layers": 3})
    v_lm, v_params = _verifier(cfg)
    layers = (0, 2, 3)  # two blocks' residual streams and the final-normed state
    lm = EagleLM(eagle_config(v_lm.config, V), V, layers)
    assert lm.feature_width == 3 * cfg.d_model and lm.verifier_layers == layers
    params = lm.attach(lm.init_net(2), v_params["embed"], np.arange(V))
    rng = np.random.default_rng(1)
    toks = jnp.asarray(rng.integers(0, V, (2, 7)), jnp.int32)
    # Each piece one jitted program (op by op, every op compiles: the test took 26 s).
    v_hidden = jax.jit(v_lm.hidden_full, static_argnames="layers")
    fwd = jax.jit(lm.forward)
    _, final = v_hidden(v_params, toks)
    _, states = v_hidden(v_params, toks, layers=layers)
    assert states.shape == (2, 7, 3 * cfg.d_model)
    np.testing.assert_allclose(states[..., 2 * cfg.d_model :], final, rtol=1e-6, atol=1e-6)
    pos = jnp.broadcast_to(jnp.arange(7), (2, 7))
    _, st2, _ = jax.jit(v_lm.forward_hidden, static_argnames="layers")(
        v_params, v_lm.init_cache(2), toks, pos, causal_block_mask(2, 7), layers=layers
    )
    np.testing.assert_allclose(st2, states, rtol=2e-5, atol=2e-5)
    h = jax.jit(lm.hidden_full)(params, toks, lm.input_features(params, states))
    want = lm.draft_logits(params, h)
    c = lm.write_features(lm.init_cache(2), states, jnp.zeros(2, jnp.int32), jnp.full(2, 6))
    got, c1 = fwd(params, c, toks, pos, causal_block_mask(2, 7))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    cc = c
    for t in range(7):
        lg, cc = fwd(params, cc, toks[:, t : t + 1], pos[:, t : t + 1], causal_block_mask(2, 1))
        cc = lm.advance(cc, 1)
        np.testing.assert_allclose(lg[:, 0], want[:, t], rtol=2e-5, atol=2e-5)
    nxt = jnp.zeros((2, 1), jnp.int32)
    lg, _ = fwd(params, lm.advance(c1, 7), nxt, jnp.full((2, 1), 7), causal_block_mask(2, 1))
    g = lm.input_features(params, states)
    own = jnp.concatenate([g[:, :6], h[:, 6:7], g[:, :1]], 1)
    h8 = jax.jit(lm.hidden_full)(params, jnp.concatenate([toks, nxt], 1), own)
    np.testing.assert_allclose(lg[:, 0], lm.draft_logits(params, h8)[:, 7], rtol=2e-5, atol=2e-5)
    # Stored [out, in] it gives the same logits.
    lm2, params2 = order_eagle(lm, params, True)
    assert lm2.feature_layers == layers
    got2, _ = jax.jit(lm2.forward)(params2, c, toks, pos, causal_block_mask(2, 7))
    np.testing.assert_allclose(got2, want, rtol=2e-5, atol=2e-5)
    with pytest.raises(ValueError, match="feature layers"):
        v_lm.hidden_full(v_params, toks, layers=(4,))
    with pytest.raises(ValueError, match="distinct"):
        EagleLM(eagle_config(v_lm.config, V), V, (1, 1))


def test_attach_rejects_a_mismatched_table():
    v_lm, v_params = _verifier()
    lm = EagleLM(eagle_config(v_lm.config, 3), V)
    with pytest.raises(ValueError, match="verifier_embed shape"):
        lm.attach(lm.init_net(0), jnp.zeros((V, 4)), np.arange(3))
    with pytest.raises(ValueError, match="distinct"):
        lm.attach(lm.init_net(0), v_params["embed"], np.array([0, 0, 1]))


def test_weight_order_and_table_storage_keep_the_outputs():
    """`order_eagle` (projections stored [out, in], as a verifier loaded out_first) gives
    the same logits; a bf16 table is held as bits and read back as its values."""
    v_lm, v_params = _verifier()
    lm, params = _eagle(v_lm, v_params, np.arange(V), seed=1)
    lm2, params2 = order_eagle(lm, params, True)
    assert lm2.config.out_first and order_eagle(lm2, params2, True)[0] is lm2
    assert params2["net"]["fc"].shape == params["net"]["fc"].shape[::-1]
    toks = jnp.array([[3, 1, 4, 1, 0]] * 2)
    pos = jnp.broadcast_to(jnp.arange(5), (2, 5))
    outs = []
    for m, p in ((lm, params), (lm2, params2)):
        c = m.write_features(
            m.init_cache(2, 16),
            jnp.ones((2, 5, v_lm.config.d_model)),
            jnp.zeros(2, jnp.int32),
            jnp.full(2, 5),
        )
        outs.append(m.forward(p, c, toks, pos, causal_block_mask(2, 5))[0])
    np.testing.assert_allclose(np.asarray(outs[0]), np.asarray(outs[1]), rtol=1e-5, atol=1e-5)
    half = jax.tree.map(lambda a: a.astype(jnp.bfloat16) if a.dtype == jnp.float32 else a, v_params)
    lm16 = EagleLM(eagle_config(v_lm.config, V, dtype="bfloat16", param_dtype="bfloat16"), V)
    p16 = lm16.attach(
        jax.tree.map(lambda a: a.astype(jnp.bfloat16), lm16.init_net(0)),
        half["embed"],
        np.arange(V),
    )
    assert p16["embed"].dtype == (jnp.uint16 if jax.default_backend() == "cpu" else jnp.bfloat16)
    np.testing.assert_array_equal(np.asarray(lm16.table(p16)), np.asarray(half["embed"]))
    np.testing.assert_array_equal(
        np.asarray(lm16.embed(p16, toks)), np.asarray(half["embed"][toks])
    )


# ----------------------------------------------------------------------------------------
# 2. Losslessness
# ----------------------------------------------------------------------------------------


def exact_law(v_lm, v_params, temperature=1.0):
    """f64[V]*LENGTH: the verifier's law of LENGTH tokens after START, enumerated."""
    seqs = np.array(list(itertools.product(range(V), repeat=LENGTH)), np.int32)
    x = np.concatenate([np.full((len(seqs), 1), START, np.int32), seqs], 1)
    logits = np.asarray(v_lm.logits_full(v_params, jnp.asarray(x)), np.float64)
    p = reference_probs(logits[:, :LENGTH], temperature)  # [n, LENGTH, V]
    law = np.prod(np.take_along_axis(p, seqs[:, :, None], -1)[..., 0], 1)
    return law.reshape((V,) * LENGTH)


KEEPS = (np.array([1, 3, 4]), np.array([0, 1, 4]), np.array([0, 2, 3]))


def _chi2_run(rule, slots_n, seed, n=N, layers=((), (), ()), depths=(1, 1, 1)):
    v_lm, v_params = _verifier()
    specs, data = [], []
    for i, (keep, tau) in enumerate(zip(KEEPS[: max(slots_n, 1)], (1.0, 0.7, 0.0))):
        lm, params = _eagle(
            v_lm, v_params, keep, seed=10 + i, scale=4.0, layers=layers[i], depth=depths[i]
        )
        specs.append(DrafterSpec(f"eagle{i}", lm, temperature=tau))
        # The deployment's maps (drafts over the head's ids) for all but the τ 0.7 one.
        data.append(identity_maps(params, V) if i == 1 else feature_maps(params, V))
    slots = np.zeros((n, 1), np.int32) if slots_n == 1 else None
    cfg = EngineConfig(
        gamma=2, rule=rule, verifier_temperature=1.0, n_slots=slots_n, max_new_tokens=LENGTH
    )
    prompts = [[START]] * n
    res = speculative_generate(
        cfg,
        v_lm,
        v_params,
        specs,
        data,
        prompts,
        [prompts] * len(specs),
        row_keys_for(seed, n),
        slots=slots,
    )
    assert (res.length - res.start == LENGTH).all()
    return v_lm, v_params, res


_RULES = [("rejection", 1), ("token_tree", 3), ("block_verification", 1)] + [
    pytest.param(r, 3, marks=pytest.mark.slow) for r in ("shared_block", "coupled", "coupled_block")
]


@pytest.mark.parametrize("rule,slots_n", _RULES)
def test_feature_drafter_is_lossless(rule, slots_n):
    v_lm, v_params, res = _chi2_run(rule, slots_n, zlib.crc32(f"eagle/{rule}".encode()))
    exact = exact_law(v_lm, v_params)
    p_value = chi2_pvalue(res.tokens[:, 1 : 1 + LENGTH], exact)
    c = res.counters
    print(
        f"\neagle {rule}: χ² p = {p_value:.3g}; accepted {c.accepted.sum(0).tolist()} of "
        f"{c.proposed.sum(0).tolist()}"
    )
    assert p_value >= ALPHA, f"feature drafter, {rule}: χ² rejects (p = {p_value:.3g})"
    if rule != "coupled_block":  # disjoint heads: the shared block accepts nothing
        assert 0 < c.accepted[:, 0].sum() < c.proposed[:, 0].sum()


# Drafters reading several verifier states (EAGLE-3), mixed with one reading the final state
# alone: the engine asks the verifier for the union and hands each drafter its own slices.
_MULTI = ((1, 0), (0,), ())


@pytest.mark.parametrize("rule,slots_n", [("rejection", 1), ("token_tree", 3)])
def test_multi_state_feature_drafters_are_lossless(rule, slots_n):
    seed = zlib.crc32(f"eagle3/{rule}".encode())
    v_lm, v_params, res = _chi2_run(rule, slots_n, seed, layers=_MULTI)
    p_value = chi2_pvalue(res.tokens[:, 1 : 1 + LENGTH], exact_law(v_lm, v_params))
    c = res.counters
    print(f"\neagle-3 {rule}: χ² p = {p_value:.3g}; accepted {c.accepted.sum(0).tolist()}")
    assert p_value >= ALPHA, f"multi-state feature drafters, {rule}: χ² rejects (p = {p_value:.3g})"
    assert 0 < c.accepted[:, 0].sum() < c.proposed[:, 0].sum()


@pytest.mark.parametrize("rule,slots_n", [("rejection", 1), ("token_tree", 3)])
def test_two_layer_feature_drafters_are_lossless(rule, slots_n):
    """A drafter of two decoder layers (alone, and first of a tree beside one-layer ones)."""
    seed = zlib.crc32(f"eagle-2l/{rule}".encode())
    v_lm, v_params, res = _chi2_run(rule, slots_n, seed, depths=(2, 1, 1))
    p_value = chi2_pvalue(res.tokens[:, 1 : 1 + LENGTH], exact_law(v_lm, v_params))
    c = res.counters
    print(f"\neagle 2 layers {rule}: χ² p = {p_value:.3g}; accepted {c.accepted.sum(0).tolist()}")
    assert p_value >= ALPHA, f"two-layer feature drafter, {rule}: χ² rejects (p = {p_value:.3g})"
    assert 0 < c.accepted[:, 0].sum() < c.proposed[:, 0].sum()


# ----------------------------------------------------------------------------------------
# 3. Greedy equality
# ----------------------------------------------------------------------------------------

TINY = TransformerConfig(
    vocab_size=12,
    d_model=16,
    n_layers=2,
    n_heads=2,
    n_kv_heads=1,
    d_ff=32,
    max_len=64,
    tie_embeddings=True,
    embed_input_scale=False,
)


def check_greedy(v_lm, v_params, d_lm, d_params, prompts, new, gamma=3, n_slots=1):
    n = len(prompts)
    ar = autoregressive_generate(
        v_lm,
        v_params,
        prompts,
        row_keys_for(4, n),
        temperature=0.0,
        max_new_tokens=new,
        min_width=16,
    )
    cfg = EngineConfig(
        gamma=gamma,
        rule="rejection" if n_slots == 1 else "token_tree",
        verifier_temperature=0.0,
        n_slots=n_slots,
        max_new_tokens=new,
    )
    specs = [DrafterSpec(f"e{i}", d_lm, temperature=0.0) for i in range(n_slots)]
    spec = speculative_generate(
        cfg,
        v_lm,
        v_params,
        specs,
        [feature_maps(d_params, v_lm.vocab_size)] * n_slots,
        prompts,
        [prompts] * n_slots,
        row_keys_for(3, n),
        min_width=16,
        drafter_min_width=[16] * n_slots,
    )
    for i, p in enumerate(prompts):
        np.testing.assert_array_equal(spec.tokens[i, : len(p) + new], ar.tokens[i, : len(p) + new])
    return spec


@pytest.mark.parametrize(
    "n_slots,layers,depth",
    [(1, (), 1), (2, (), 1), (1, (0, 2), 1), (2, (1, 0, 2), 1), (1, (), 2), (2, (), 2)],
)
def test_greedy_equals_autoregressive(n_slots, layers, depth):
    v_lm, v_params = _verifier(TINY, seed=5, sharpen=4.0)
    d_lm, d_params = _eagle(
        v_lm, v_params, np.arange(0, 12, 1)[:9], seed=2, scale=2.0, layers=layers, depth=depth
    )
    rng = np.random.default_rng(1)
    prompts = [list(map(int, rng.integers(0, 12, 2 + i % 7))) for i in range(8)]  # ragged
    spec = check_greedy(v_lm, v_params, d_lm, d_params, prompts, new=20, n_slots=n_slots)
    c = spec.counters
    assert 0 < c.accepted.sum() < c.proposed.sum()


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (fake) devices")
def test_sharded_feature_drafter_equals_unsharded():
    """Verifier and feature drafter placed on a 2 × 4 mesh (fsdp_tp): the FeatureCache is
    built and carried inside the engine's programs from sharded inputs; τ 1 tokens and
    acceptance equal the single-device run."""
    from specjax.runtime import sharding as shd

    v_lm, v_params = _verifier(TINY, seed=5, sharpen=4.0)
    d_lm, d_params = _eagle(v_lm, v_params, np.arange(12)[:9], seed=2, scale=2.0)
    rng = np.random.default_rng(3)
    prompts = [list(map(int, rng.integers(0, 12, 2 + i % 5))) for i in range(8)]
    cfg = EngineConfig(gamma=3, rule="rejection", verifier_temperature=1.0, max_new_tokens=12)

    def run(vp, dp):
        return speculative_generate(
            cfg,
            v_lm,
            vp,
            [DrafterSpec("e", d_lm, temperature=1.0)],
            [feature_maps(dp, v_lm.vocab_size)],
            prompts,
            [prompts],
            row_keys_for(7, len(prompts)),
            min_width=16,
            drafter_min_width=[16],
        )

    ref = run(v_params, d_params)
    mesh = shd.make_mesh(2, 4)
    sv = shd.shard_lm_params(v_lm, v_params, mesh, "fsdp_tp")
    sd = shd.shard_lm_params(d_lm, d_params, mesh, "fsdp_tp")
    assert len(jax.tree.leaves(sd["net"])[0].sharding.device_set) == 8
    got = run(sv, sd)
    np.testing.assert_array_equal(got.tokens, ref.tokens)
    np.testing.assert_array_equal(got.counters.accepted, ref.counters.accepted)
    assert 0 < ref.counters.accepted.sum() < ref.counters.proposed.sum()


@pytest.mark.parametrize("layers", [(), (1, 0, 2)])
def test_continuous_batching_with_a_feature_drafter_equals_static(layers):
    """Refills and pauses move a feature drafter's cache (its verifier features) like a KV
    cache: at τ 1 each prompt's tokens, rounds and accepted drafts equal its static
    batch's (tests/test_batching.py's harness), with the final-normed state and with
    several states. Rule 'rejection' on a flat verifier, so that the tokens depend on the
    drafter's q: with the refill's prompt features zeroed, or another drafter's slices
    picked, prompts come out differently."""
    from test_batching import _check

    v_lm, v_params = _verifier(TINY, seed=5)
    d_lm, d_params = _eagle(v_lm, v_params, np.arange(12)[:9], seed=2, scale=2.0, layers=layers)
    rng = np.random.default_rng(2)
    n = 6
    prompts = [list(map(int, rng.integers(0, 12, rng.integers(1, 5)))) for _ in range(n)]
    cfg = EngineConfig(gamma=3, rule="rejection", verifier_temperature=1.0)
    res = _check(
        cfg,
        v_lm,
        v_params,
        prompts,
        [12, 20] * 3,
        row_keys_for(5, n),
        None,
        2,
        4,
        drafters=[DrafterSpec("e", d_lm, temperature=1.0)],
        d_data=[feature_maps(d_params, v_lm.vocab_size)],
        drafter_prompts=[prompts],
    )
    assert res.refills > 1 and 0 < res.accepted.sum() < res.proposed.sum()


def test_continuing_without_features_is_refused():
    v_lm, v_params = _verifier(TINY, seed=5, sharpen=4.0)
    d_lm, d_params = _eagle(v_lm, v_params, np.arange(12), seed=2)
    prompts = [[1, 2, 3]]
    data = [identity_maps(d_params, 12)]
    cfg = EngineConfig(gamma=2, rule="rejection", verifier_temperature=0.0, max_new_tokens=4)
    res = speculative_generate(
        cfg,
        v_lm,
        v_params,
        [DrafterSpec("e", d_lm)],
        data,
        prompts,
        [prompts],
        row_keys_for(0, 1),
        return_state=True,
        reserve=8,
    )
    # A state of speculative calls continues...
    more = speculative_generate(
        cfg,
        v_lm,
        v_params,
        [DrafterSpec("e", d_lm)],
        data,
        None,
        None,
        row_keys_for(0, 1),
        state=res.state,
    )
    assert more.length[0] > res.length[0]
    # ...one whose features were dropped (tokens committed elsewhere) does not.
    st = res.state
    gone = st.replace(dcaches=(st.dcaches[0].replace(vlen=jnp.zeros_like(st.dcaches[0].vlen)),))
    with pytest.raises(ConfigError, match="reads the verifier's features"):
        speculative_generate(
            cfg,
            v_lm,
            v_params,
            [DrafterSpec("e", d_lm)],
            data,
            None,
            None,
            row_keys_for(0, 1),
            state=gone,
        )


@pytest.mark.slow
def test_greedy_equality_on_smollm2_with_the_shipped_feature_drafter():
    """The shipped feature drafter beside SmolLM2 (f32): 64 greedy tokens on 3 prompts
    equal the verifier's own, alone (rule 1 and block verification), in a token tree with
    prompt lookup and with its own twin."""
    from specjax.models import gguf  # pylint: disable=import-outside-toplevel
    from specjax.runner.deployments.smollm2 import from_smollm2  # pylint: disable=import-outside-toplevel

    try:
        smol = gguf.smollm2(max_len=512)
    except ConfigError as e:
        pytest.skip(f"SmolLM2 wheel not installed: {e}")
    dep = from_smollm2(["eagle", "lookup"], verifier=smol)
    texts = [
        "Write a Python function that reverses a list.",
        "Describe a quiet harbour town.",
        "What is 12 + 30?",
    ]
    # Twins (the eagle named twice): its samples as sibling chains, drafted in one pass.
    cases = [
        (["eagle"], "rejection"),
        (["eagle"], "block_verification"),
        (["eagle", "lookup"], "token_tree"),
        (["eagle", "eagle"], "token_tree"),
    ]
    for (names, _), c in zip(cases, check_greedy_cases(dep, texts, cases, new=64)):
        print(f"\n{names}: accepted {c.accepted.sum(0).tolist()} of {c.proposed.sum(0).tolist()}")
        assert c.accepted[:, 0].sum() > 0


def test_a_verifier_without_features_is_refused():
    from specjax import testing as suite  # pylint: disable=import-outside-toplevel

    setup = suite.make_setup("random", seed=41)
    v_lm, v_params = _verifier()
    d_lm, d_params = _eagle(v_lm, v_params, np.arange(V), seed=2)
    cfg = EngineConfig(gamma=2, rule="rejection", verifier_temperature=1.0, max_new_tokens=2)
    with pytest.raises(ConfigError, match="forward_hidden"):
        speculative_generate(
            cfg,
            setup.verifier,
            setup.v_params,
            [DrafterSpec("e", d_lm)],
            [identity_maps(d_params, V)],
            [[START]],
            [[[START]]],
            row_keys_for(0, 1),
        )


def test_feature_layers_past_the_verifier_are_refused():
    v_lm, v_params = _verifier(TINY, seed=5, sharpen=4.0)
    d_lm, d_params = _eagle(v_lm, v_params, np.arange(12), seed=2, layers=(0, 3))
    prompts = [[1, 2, 3]]
    cfg = EngineConfig(gamma=2, rule="rejection", verifier_temperature=0.0, max_new_tokens=4)
    with pytest.raises(ConfigError, match=r"feature_layers: got \(0, 3\); allowed: layer indices"):
        speculative_generate(
            cfg,
            v_lm,
            v_params,
            [DrafterSpec("e", d_lm)],
            [feature_maps(d_params, 12)],
            prompts,
            [prompts],
            row_keys_for(0, 1),
        )
