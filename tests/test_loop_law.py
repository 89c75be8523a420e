"""`specjax.measure.loop_law`: the loop's round law given the text, against a simulation of rule 1
itself; and `distill_eagle.feature_alpha_positions`, the per-position inputs it takes."""

from __future__ import annotations

import numpy as np
import pytest

from specjax.measure import loop_law


def _simulate_rule1(p, q, gamma: int, n_rows: int, seed: int):
    """Rule-1 speculative sampling along T positions of a first-order Markov text: at
    position t after token ``prev`` the verifier's law is p[t, prev] (p f[T, V, V]) and
    step k + 1 drafts from q[t, prev, min(k, K - 1)] (q f[T, V, K, V]); row r starts after
    token r % V. Returns (prev i32[R, T] the token before each position, tokens i32[R, T]
    the committed ones, step_accepted f[γ], step_reached f[γ], rounds): the loop's own
    counts, pooled over rows."""
    rng = np.random.default_rng(seed)
    T, V = p.shape[0], p.shape[-1]
    K = q.shape[2]
    prevs = np.zeros((n_rows, T), np.int64)
    tokens = np.zeros((n_rows, T), np.int64)
    prev = np.arange(n_rows) % V
    depth = np.zeros(n_rows, np.int64)
    accepted, reached, rounds = np.zeros(gamma), np.zeros(gamma), 0
    rows = np.arange(n_rows)

    def draw(law):
        return (rng.random(n_rows)[:, None] > np.cumsum(law, -1)).sum(-1).clip(0, V - 1)

    for t in range(T):
        rounds += int(np.sum(depth == 0))
        bonus = depth == gamma
        pt = p[t, prev]  # [R, V]
        qt = q[t, prev, np.minimum(depth, K - 1)]  # [R, V]
        draft = draw(qt)
        ok = (rng.random(n_rows) < np.minimum(1.0, pt[rows, draft] / qt[rows, draft])) & ~bonus
        resid = np.maximum(pt - qt, 0.0)
        resid /= np.maximum(resid.sum(-1, keepdims=True), 1e-300)
        prevs[:, t] = prev
        tokens[:, t] = np.where(bonus, draw(pt), np.where(ok, draft, draw(resid)))
        for j in range(gamma):
            reached[j] += np.sum(depth == j)
            accepted[j] += np.sum((depth == j) & ok)
        depth = np.where(bonus | ~ok, 0, depth + 1)
        prev = tokens[:, t]
    return prevs, tokens, accepted, reached, rounds


def _laws(T, K, V, seed):
    """Context-dependent laws in which a drafter good after some tokens and poor after
    others makes the round starts a biased sample of the positions."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(V, 0.5), size=(T, V))
    q = rng.dirichlet(np.full(V, 0.5), size=(T, V, K))
    good = np.arange(V) < V // 2  # after these tokens the drafter is nearly exact
    q[:, good] = 0.9 * p[:, good, None] + 0.1 * q[:, good]
    q[0, 0, 0] = np.eye(V)[0]  # a one-hot q (prompt lookup's), without p's support
    return p, q


def _prediction(p, q, prevs, tokens, gamma, accept_given_token=True):
    R, T = tokens.shape
    K = q.shape[2]
    t = np.arange(T)[None, :]
    pt = p[t, prevs]  # [R, T, V]
    qt = q[t, prevs]  # [R, T, K, V]
    alpha = np.minimum(pt[:, :, None], qt).sum(-1)  # [R, T, K]
    px = np.take_along_axis(pt, tokens[..., None], -1)  # [R, T, 1]
    qx = np.take_along_axis(qt, tokens[:, :, None, None].repeat(K, 2), -1)[..., 0]
    acc = np.minimum(1.0, qx / px) if accept_given_token else alpha
    return loop_law.loop_alpha(alpha, acc, np.ones((R, T), bool), gamma)


def test_the_prediction_matches_rule_1_simulated():
    """Per-step acceptance (accepted ÷ reached), rounds and tokens per round of rule 1
    simulated over 40,000 paths of a context-dependent text agree with `loop_alpha`
    applied to each simulated text (its posterior accept probabilities from the committed
    tokens) and averaged: within 5 standard errors, at γ 2 and 3, with a different drafter
    law at deeper steps. The same chain driven by each position's expected acceptance
    instead (no selection by the committed token) is off by more than 5 at step 1: the
    laws make round starts a biased sample, so the test can tell the two apart."""
    T, K, V, R = 10, 2, 4, 40_000
    p, q = _laws(T, K, V, seed=3)
    for gamma in (2, 3):
        prevs, tokens, acc_n, reach_n, rounds = _simulate_rule1(p, q, gamma, R, seed=gamma)
        pred = _prediction(p, q, prevs, tokens, gamma)
        emp = acc_n / reach_n
        se = np.sqrt(emp * (1 - emp) / reach_n)
        assert np.all(np.abs(pred['step_alpha'] - emp) < 5 * se), (gamma, pred, emp)
        np.testing.assert_allclose(pred['reached'], reach_n, rtol=0.02)
        np.testing.assert_allclose(pred['rounds'], rounds, rtol=0.01)
        assert abs(pred['tokens_per_round'] - R * T / rounds) < 0.02
        naive = _prediction(p, q, prevs, tokens, gamma, accept_given_token=False)
        assert abs(naive['step_alpha'][0] - emp[0]) > 5 * se[0], (naive, emp)


def test_round_states_in_the_limits():
    """Every draft accepted: the states cycle 0, 1, …, γ (a bonus token ends each round);
    none accepted: every position starts a round; positions outside the mask are skipped
    without moving the state; each position's states sum to 1."""
    N, T, g = 2, 9, 3
    mask = np.ones((N, T), bool)
    s = loop_law.round_states(np.ones((N, T, 1)), mask, g)
    np.testing.assert_array_equal(s.argmax(-1)[0], [0, 1, 2, 3, 0, 1, 2, 3, 0])
    r = loop_law.loop_alpha(np.full((N, T, 1), 0.5), np.ones((N, T, 1)), mask, g)
    assert r['tokens_per_round'] == pytest.approx(T / 3)
    s0 = loop_law.round_states(np.zeros((N, T, 2)), mask, g)
    np.testing.assert_array_equal(s0[..., 0], 1.0)
    gaps = mask.copy()
    gaps[:, [1, 2]] = False
    sg = loop_law.round_states(np.ones((N, T, 1)), gaps, g)
    np.testing.assert_array_equal(sg.argmax(-1)[0, [0, 3, 4, 5]], [0, 1, 2, 3])
    np.testing.assert_array_equal(sg[:, [1, 2]], 0.0)
    rng = np.random.default_rng(0)
    sr = loop_law.round_states(rng.random((N, T, 2)), mask, g)
    np.testing.assert_allclose(sr.sum(-1), 1.0)


@pytest.mark.parametrize(
    'args, match',
    [
        ((np.ones((2, 3)), np.ones((2, 3), bool), 2), 'acc: shape'),
        ((np.ones((2, 3, 1)), np.ones((2, 4), bool), 2), 'mask: shape'),
        ((np.ones((2, 3, 1)), np.ones((2, 3), bool), 0), 'gamma: got 0'),
        ((np.full((2, 3, 1), 1.5), np.ones((2, 3), bool), 2), r'acc: probabilities'),
    ],
)
def test_bad_inputs_name_the_field(args, match):
    with pytest.raises(ValueError, match=match):
        loop_law.round_states(*args)
    with pytest.raises(ValueError, match='alpha: shape'):
        loop_law.loop_alpha(np.ones((1, 1, 1)), np.ones((2, 3, 1)), np.ones((2, 3), bool), 2)


def test_feature_alpha_positions_agree_with_feature_alpha():
    """The per-position figures of a tiny feature drafter: their means over the reply
    positions are `feature_alpha`'s α at steps 1 and 2; the accept probabilities are
    min(1, q(x) / p(x)) in [0, 1] and the mask is the reply mask."""
    import types  # pylint: disable=import-outside-toplevel

    from test_distill_eagle import _random_features
    from test_eagle import TINY, _verifier

    from specjax.train import distill_eagle  # pylint: disable=import-outside-toplevel

    v_lm, v_params = _verifier(TINY, seed=5, sharpen=2.0)
    model = types.SimpleNamespace(lm=v_lm, params=v_params, tokenizer=None)
    data, _ = _random_features(v_lm, v_params, rows=6, width=12, seed=7)
    recipe = distill_eagle.EagleRecipe(kept=8, noise=0.0)
    lm, params = distill_eagle.initial_eagle(model, data, recipe, max_len=32)
    ref = distill_eagle.feature_alpha(lm, params, data, batch=4)
    pos = distill_eagle.feature_alpha_positions(lm, params, data, steps=3, batch=4)
    m = pos['mask']
    np.testing.assert_array_equal(m, data.reply_mask())
    np.testing.assert_allclose(pos['alpha'][m][:, 0].mean(), ref['alpha1'], atol=1e-5)
    np.testing.assert_allclose(pos['alpha'][m][:, 1].mean(), ref['alpha2'], atol=1e-5)
    assert pos['alpha'].shape == pos['accept'].shape == (6, 12, 3)
    assert np.all((pos['accept'] >= 0) & (pos['accept'] <= 1))
    assert np.any(pos['accept'][m] == 0.0)  # tokens outside the 8 kept ids
    with pytest.raises(ValueError, match='steps: got 0'):
        distill_eagle.feature_alpha_positions(lm, params, data, steps=0)


def test_the_loop_loss_is_the_laws_weighted_acceptance():
    """`EagleRecipe.loop_weight`'s term (in-graph, `distill_eagle._loop_tv`) is 1 − the
    step-weighted acceptance `loop_alpha` computes from the same laws: p and q over 6 kept
    ids of 9, committed tokens inside and outside them, two passes, ragged masks."""
    import types  # pylint: disable=import-outside-toplevel

    import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

    from specjax.train import distill_eagle  # pylint: disable=import-outside-toplevel

    rng = np.random.default_rng(4)
    B, W, V, n, g = 3, 11, 9, 6, 3
    keep = np.array([7, 0, 3, 8, 2, 5])
    p = rng.dirichlet(np.full(n, 0.7), size=(B, W))
    qs = [rng.dirichlet(np.full(n, 0.7), size=(B, W)) for _ in range(2)]
    tokens = rng.integers(0, V, (B, W))
    mask = np.zeros((B, W), np.float32)
    mask[0, 2:10], mask[1, 0:10], mask[2, 5:9] = 1, 1, 1
    got = distill_eagle._loop_tv(  # pylint: disable=protected-access
        jnp.asarray(p, jnp.float32),
        [jnp.log(jnp.asarray(q, jnp.float32)) for q in qs],
        jnp.asarray(tokens),
        jnp.asarray(keep),
        jnp.asarray(mask),
        g,
        types.SimpleNamespace(verifier_vocab=V),
    )
    inv = np.full(V, -1)
    inv[keep] = np.arange(n)
    nxt = inv[np.concatenate([tokens[:, 1:], tokens[:, -1:]], 1)]
    j = np.maximum(nxt, 0)[..., None]
    alpha = np.stack([np.minimum(p, q).sum(-1) for q in qs], -1)
    p_x = np.take_along_axis(p, j, -1)[..., 0]
    acc = np.stack(
        [
            np.where(nxt >= 0, np.minimum(1, np.take_along_axis(q, j, -1)[..., 0] / p_x), 0)
            for q in qs
        ],
        -1,
    )
    r = loop_law.loop_alpha(alpha, acc, mask > 0, g)
    want = 1 - (r['step_alpha'] * r['reached']).sum() / r['reached'].sum()
    np.testing.assert_allclose(float(got), want, rtol=1e-5)


def test_standard_errors_over_rows():
    """The figures' standard errors are the delta method's over rows: 0 when every row has
    the same ratio, and the textbook value for two rows with different ones."""
    same = loop_law._ratio_se([1.0, 2.0, 3.0], [2.0, 4.0, 6.0])  # pylint: disable=protected-access
    assert same == pytest.approx(0.0, abs=1e-15)
    num, den = np.array([1.0, 3.0]), np.array([2.0, 2.0])
    r = num.sum() / den.sum()
    want = np.sqrt(2 / 1 * np.sum((num - r * den) ** 2)) / den.sum()
    assert loop_law._ratio_se(num, den) == pytest.approx(want)  # pylint: disable=protected-access
    rng = np.random.default_rng(1)
    acc = rng.random((16, 20, 2))
    res = loop_law.loop_alpha(acc, acc, np.ones((16, 20), bool), 3)
    assert np.all(np.isfinite(res['step_alpha_se'])) and res['tokens_per_round_se'] > 0


def test_the_engine_drafts_where_and_as_the_law_says():
    """The engine's loop against the law on its own paths: a tiny verifier and a feature
    drafter over 8 of its 12 ids, rule 1, γ 3, τ 1, 512 rows. Given the committed texts,
    `loop_law` predicts the loop's step-1 acceptance from the drafter's teacher-forced
    acceptance there (the verifier's features over the paths, one prefill); the loop's own
    counters agree within 5 standard errors (the accept draws' noise), and its tokens per
    round within 3%. The positions' plain teacher-forced mean is farther off than the
    prediction: the comparison sees where the loop drafts, not just how well. A drafter
    reading a stale feature at a round start would miss the prediction."""
    import types  # pylint: disable=import-outside-toplevel

    from test_eagle import TINY, _eagle, _verifier

    from specjax.engine.generate import (  # pylint: disable=import-outside-toplevel
        row_keys_for,
        speculative_generate,
    )
    from specjax.engine.spec import (  # pylint: disable=import-outside-toplevel
        DrafterSpec,
        EngineConfig,
        feature_maps,
    )
    from specjax.train import distill, distill_eagle  # pylint: disable=import-outside-toplevel

    v_lm, v_params = _verifier(TINY, seed=5)
    keep = np.array([0, 1, 2, 4, 5, 7, 9, 11])
    d_lm, d_params = _eagle(v_lm, v_params, keep, seed=3)
    n, new, gamma = 512, 24, 3
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 12, 3).tolist() for _ in range(n)]
    cfg = EngineConfig(gamma=gamma, rule='rejection', verifier_temperature=1.0, max_new_tokens=new)
    res = speculative_generate(
        cfg,
        v_lm,
        v_params,
        [DrafterSpec('e', d_lm, temperature=1.0)],
        [feature_maps(d_params, v_lm.vocab_size)],
        prompts,
        [prompts],
        row_keys_for(7, n),
    )
    acc = np.asarray(res.counters.own_accepted_at)[:, 0].astype(float)  # [n, γ]
    reach = np.asarray(res.counters.own_reached_at)[:, 0].astype(float)
    gen = distill.Generated.from_pairs([(p, res.new_tokens(r)) for r, p in enumerate(prompts)], 1.0)
    model = types.SimpleNamespace(lm=v_lm, params=v_params)
    feats = distill_eagle.verifier_features(model, gen, bucket=32, log=lambda s: None)
    pos = distill_eagle.feature_alpha_positions(d_lm, d_params, feats, steps=3)
    pred = loop_law.loop_alpha(pos['alpha'], pos['accept'], pos['mask'], gamma)
    a1 = acc[:, 0].sum() / reach[:, 0].sum()
    se1 = loop_law._ratio_se(acc[:, 0], reach[:, 0])  # pylint: disable=protected-access
    assert abs(pred['step_alpha'][0] - a1) < 5 * se1, (pred, a1, se1)
    assert abs(pred['step_alpha'][0] - a1) < abs(pred['forced_alpha'][0] - a1)
    rounds = np.asarray(res.counters.rounds).sum()
    assert pred['tokens_per_round'] == pytest.approx(n * new / rounds, rel=0.03)


def test_a_paired_difference_on_shared_texts():
    """Two drafters on the same texts: the difference's standard error is 0 for a drafter
    against itself, below either figure's own for two correlated ones, and equals the
    plain difference of the figures; results over other texts are refused."""
    rng = np.random.default_rng(2)
    N, T, g = 24, 30, 3
    mask = np.ones((N, T), bool)
    base = rng.random((N, T, 2))
    other = np.clip(base + 0.05 * rng.standard_normal(base.shape), 0, 1)
    a = loop_law.loop_alpha(base, base, mask, g)
    b = loop_law.loop_alpha(other, other, mask, g)
    same = loop_law.paired_difference(a, a)
    assert same['tokens_per_round'] == 0 and same['tokens_per_round_se'] == 0
    d = loop_law.paired_difference(a, b)
    assert d['tokens_per_round'] == pytest.approx(a['tokens_per_round'] - b['tokens_per_round'])
    assert 0 < d['tokens_per_round_se'] < min(a['tokens_per_round_se'], b['tokens_per_round_se'])
    np.testing.assert_allclose(d['step_alpha'], a['step_alpha'] - b['step_alpha'])
    shorter = loop_law.loop_alpha(base, base, mask & (np.arange(T) < 20), g)
    with pytest.raises(ValueError, match='not over the same texts'):
        loop_law.paired_difference(a, shorter)
