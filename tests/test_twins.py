"""Twins: one drafter named several times in a call (a tree of its samples, SpecInfer-style).

`share_drafting` marks them (`DrafterStatic.shares`); the engine consumes and drafts them in
one batched pass and, under `token_tree`, draws their first drafts without replacement in
each row's slot order (`specjax.engine.drafting.draft_group`).

1. Which drafters are twins: the same static part and the very same arrays.
2. The draw without replacement (`draw`'s `exclude`): q is 0 on the excluded ids and sums
   to 1, the rest of the law renormalised (τ > 0) or the best id left (τ 0); a row with no
   id left keeps the drafter's own law.
3. Losslessness: χ² against the exact law (N = 100,000 rows, α = 1e-3, the harness of
   tests/test_verify.py) for feature, transformer and cross-vocabulary twins, with rows whose
   slots hold the twins in every order (and leave some out): a member placed ahead of an
   earlier-drawn twin must not exclude that twin's draft, or the rule is biased — the same
   suite with the order ignored is rejected at p < 1e-300 (run by hand when this was built).
4. Batched and apart agree: under a rule that draws twins independently (`shared_block`),
   twins sharing arrays give the tokens of the same drafters with copied arrays.
Greedy equality with twins: tests/test_eagle.py (`check_greedy` passes one maps object per
slot, so its two-slot cases are twins) and the SmolLM2 case there (slow).
"""

from __future__ import annotations

import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from lossless_reference import reference_law
from test_eagle import KEEPS, LENGTH, START, V, _eagle, _verifier, exact_law
from test_verify import ALPHA, N, chi2_pvalue

from specjax import testing as suite
from specjax.engine.drafting import draw
from specjax.engine.generate import row_keys_for, speculative_generate
from specjax.engine.spec import (
    DrafterSpec,
    EngineConfig,
    feature_maps,
    identity_maps,
    share_drafting,
)
from specjax.models.api import TransformerLM
from specjax.models.transformer import TransformerConfig
from specjax.verify.qlaw import q_dense

# Slot orders of the rows (cycled): every order of three twins, and rows leaving one out.
ORDERS = np.array([[0, 1, 2], [2, 1, 0], [1, 2, 0], [0, 2, 1], [1, -1, 0], [2, 0, -1]], np.int32)


def _copy(data):
    return data.replace(
        params=jax.tree_util.tree_map(lambda a: jnp.array(a, copy=True), data.params)
    )


# ----------------------------------------------------------------------------------------
# 1. Which drafters are twins
# ----------------------------------------------------------------------------------------


def test_share_drafting_marks_the_same_drafter_named_twice():
    v_lm, v_params = _verifier()
    lm, params = _eagle(v_lm, v_params, KEEPS[0], seed=1)
    data = feature_maps(params, V)
    a = DrafterSpec("a", lm, temperature=1.0)
    hot = DrafterSpec("b", lm, temperature=0.5)  # temperature is data: still a twin
    filtered = DrafterSpec("c", lm, temperature=1.0, top_k=2)  # another static part
    statics = [d.static for d in (a, hot, filtered, a, a)]
    shares = [s.shares for s in share_drafting(statics, [data, data, data, _copy(data), data])]
    assert shares == [None, 0, None, None, 0]
    assert [s.shares for s in share_drafting(statics[:1], [data])] == [None]


# ----------------------------------------------------------------------------------------
# 2. The draw without replacement
# ----------------------------------------------------------------------------------------


def test_draws_without_replacement_remove_the_excluded_ids():
    v_lm, v_params = _verifier()
    lm, params = _eagle(v_lm, v_params, KEEPS[0], seed=1)  # head over ids 1, 3, 4
    spec = DrafterSpec("a", lm, temperature=1.0).static
    logits = jnp.array([[0.0, 1.0, 0.0, 2.0, 0.5], [0.0, 1.0, 0.0, 2.0, 0.5]])
    u = jnp.array([0.3, 0.9])
    for data in (feature_maps(params, V), identity_maps(params, V)):
        data = data.replace(temperature=jnp.float32(1.0))
        _, _, q0 = draw(False, spec, data, V, logits, u)
        x, _, q = draw(False, spec, data, V, logits, u, jnp.array([[3, -2], [3, 1]]))
        q0, q = np.asarray(q_dense(q0)), np.asarray(q_dense(q))
        np.testing.assert_allclose(q.sum(-1), 1.0, rtol=1e-6)
        assert q[0, 3] == 0 and q[1, 3] == 0 and q[1, 1] == 0
        assert all(int(x[r]) not in ex for r, ex in enumerate(([3], [3, 1])))
        # Row 0: the rest of the law renormalised.
        keep = np.ones(V, bool)
        keep[3] = False
        np.testing.assert_allclose(q[0][keep], q0[0][keep] / q0[0][keep].sum(), rtol=1e-5)
    # A greedy drafter (τ 0): the best id left; with every id of its head excluded, its own.
    data = feature_maps(params, V).replace(temperature=jnp.float32(0.0))
    x, _, q = draw(False, spec, data, V, logits[:1], u[:1], jnp.array([[3]]))
    assert int(x[0]) == 1 and float(q_dense(q)[0, 1]) == 1.0
    x, _, q = draw(False, spec, data, V, logits[:1], u[:1], jnp.array([[3, 1, 4]]))
    assert int(x[0]) == 3 and float(q_dense(q)[0, 3]) == 1.0


# ----------------------------------------------------------------------------------------
# 3. Losslessness
# ----------------------------------------------------------------------------------------


def _run(cfg, v_lm, v_params, specs, data, seed, n=N, slots=None):
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
    return res


def _tree(slots_n=3, rule="token_tree"):
    return EngineConfig(
        gamma=2, rule=rule, verifier_temperature=1.0, n_slots=slots_n, max_new_tokens=LENGTH
    )


def _check(name, res, v_lm, v_params):
    p_value = chi2_pvalue(res.tokens[:, 1 : 1 + LENGTH], exact_law(v_lm, v_params))
    c = res.counters
    print(f"\n{name}: χ² p = {p_value:.3g}; accepted {c.accepted.sum(0).tolist()}")
    assert p_value >= ALPHA, f"{name}: χ² rejects (p = {p_value:.3g})"
    return c


def test_feature_twins_are_lossless_in_every_slot_order():
    v_lm, v_params = _verifier()
    lm, params = _eagle(v_lm, v_params, KEEPS[0], seed=10, scale=4.0)
    data = feature_maps(params, V)
    specs = [DrafterSpec("e", lm, temperature=t) for t in (1.0, 1.0, 0.7)]
    slots = ORDERS[np.arange(N) % len(ORDERS)]
    res = _run(_tree(), v_lm, v_params, specs, [data] * 3, zlib.crc32(b"twins/eagle"), slots=slots)
    c = _check("feature twins", res, v_lm, v_params)
    assert (c.accepted.sum(0) > 0).all()  # every twin's chain is accepted somewhere


SMALL_DRAFTER = TransformerConfig(
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


@pytest.mark.slow  # CI time (make test ≤ 15 min on a cold clone); `make test-all` runs it
def test_transformer_twins_beside_another_drafter_are_lossless():
    """Twins that keep their accepted drafts in their caches (not feature drafters), the
    third slot another drafter."""
    v_lm, v_params = _verifier()
    d_lm = TransformerLM(SMALL_DRAFTER)
    twin = identity_maps(d_lm.init_params(7), V)
    other = identity_maps(d_lm.init_params(8), V)
    specs = [DrafterSpec("t", d_lm), DrafterSpec("t", d_lm), DrafterSpec("o", d_lm)]
    slots = ORDERS[np.arange(N) % len(ORDERS)]
    res = _run(
        _tree(), v_lm, v_params, specs, [twin, twin, other], zlib.crc32(b"twins/tf"), slots=slots
    )
    assert share_drafting([s.static for s in specs], [twin, twin, other])[1].shares == 0
    _check("transformer twins", res, v_lm, v_params)


@pytest.mark.parametrize(
    "rule", ["token_tree", pytest.param("shared_block", marks=pytest.mark.slow)]
)
def test_cross_vocabulary_twins_are_lossless(rule):
    """Twins of another tokenizer (the suite's bigram drafters, rule 3's maps)."""
    setup = suite.make_setup("random", seed=23)
    # Drafter 2 spells two verifier ids in two of its tokens; drafter 1 reverses the ids.
    picks = [2, 2, 1]
    specs = [setup.drafters[i] for i in picks]
    data = [setup.d_data[i] for i in picks]
    spelt = suite.drafter_prompts([START])
    res = speculative_generate(
        _tree(rule=rule),
        setup.verifier,
        setup.v_params,
        specs,
        data,
        [[START]] * N,
        [[spelt[i]] * N for i in picks],
        row_keys_for(zlib.crc32(f"twins/cross/{rule}".encode()), N),
        slots=ORDERS[np.arange(N) % len(ORDERS)],
    )
    p_value = chi2_pvalue(
        res.tokens[:, 1 : 1 + LENGTH], reference_law(setup.v_table, 1.0, START, LENGTH)
    )
    print(f"\ncross-vocabulary twins, {rule}: χ² p = {p_value:.3g}")
    assert p_value >= ALPHA, f"cross-vocabulary twins, {rule}: χ² rejects (p = {p_value:.3g})"


# ----------------------------------------------------------------------------------------
# 4. Batched and apart agree
# ----------------------------------------------------------------------------------------


def test_twins_drafted_together_equal_twins_drafted_apart():
    v_lm, v_params = _verifier()
    lm, params = _eagle(v_lm, v_params, KEEPS[1], seed=3, scale=2.0)
    data = feature_maps(params, V)
    specs = [DrafterSpec("e", lm)] * 3
    cfg = _tree(rule="shared_block")
    together = _run(cfg, v_lm, v_params, specs, [data] * 3, 5, n=2000)
    apart = _run(cfg, v_lm, v_params, specs, [data, _copy(data), _copy(data)], 5, n=2000)
    np.testing.assert_array_equal(together.tokens, apart.tokens)
    np.testing.assert_array_equal(together.counters.accepted, apart.counters.accepted)
