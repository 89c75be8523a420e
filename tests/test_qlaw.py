"""A drafter's law held on its support (`specjax.verify.qlaw.SparseQ`) is the same law.

1. The helpers: `q_at`, `q_dense`, `widen`, and the tree rule's unnormalised residual
   step against `distributions.residual` (its no-mass fallback included).
2. Every rule gives the same verdict for a `SparseQ` and for its dense form, on the same
   keys (rows whose q has few ids, padding, inactive slots).
3. χ² (N = 100k, α = 1e-3, tests/test_verify.py's design) of `token_tree` and
   `shared_block` called with `SparseQ` laws whose supports miss ids p has, against the
   exact target — and a negative control: the same generator with the residual step
   ignoring the support's padding convention is rejected.
4. The engine: a call whose drafters all have sparse laws (a feature drafter, prompt
   lookup) gives the same tokens and counters under `q_layout='sparse'` as under 'dense'
   (the default), and an unknown layout is refused in one line.
"""

from __future__ import annotations

import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from lossless_reference import reference_law
from test_lossless import _control_tables, rule_level_generate
from test_verify import ALPHA, LENGTH, START, N, chi2_pvalue

from specjax.errors import ConfigError
from specjax.verify import qlaw, registry, rules
from specjax.verify.distributions import residual
from specjax.verify.qlaw import SparseQ, q_at, q_dense, residual_update, widen


def _random_sparse(rng, lead, vocab, width, nnz):
    """A SparseQ of shape lead + (vocab,): `nnz` ≤ width distinct ids per row carry mass,
    the rest of the width is sentinel padding."""
    ids = np.full(lead + (width,), vocab, np.int32)
    vals = np.zeros(lead + (width,), np.float32)
    for idx in np.ndindex(*lead):
        pick = rng.choice(vocab, nnz, replace=False)
        slots = rng.choice(width, nnz, replace=False)  # padding anywhere in the row
        ids[idx][slots] = pick
        w = rng.gamma(0.5, size=nnz) + 1e-3
        vals[idx][slots] = w / w.sum()
    return SparseQ(ids=jnp.asarray(ids), vals=jnp.asarray(vals), vocab=vocab)


def test_helpers_match_the_dense_law():
    rng = np.random.default_rng(0)
    q = _random_sparse(rng, (3, 2), 11, width=5, nnz=3)
    dense = np.asarray(q_dense(q))
    assert dense.shape == (3, 2, 11) == q.shape
    np.testing.assert_allclose(dense.sum(-1), 1.0, rtol=1e-6)
    x = jnp.asarray(rng.integers(0, 11, (3, 2)), jnp.int32)
    np.testing.assert_array_equal(
        np.asarray(q_at(q, x)), np.take_along_axis(dense, np.asarray(x)[..., None], -1)[..., 0]
    )
    np.testing.assert_array_equal(np.asarray(q_dense(widen(q, 9))), dense)
    np.testing.assert_array_equal(np.asarray(q_dense(q[1])), dense[1])
    one = qlaw.point_mass(jnp.array([2, 7]), 11)
    np.testing.assert_array_equal(np.asarray(q_dense(one)), np.eye(11)[[2, 7]])


@pytest.mark.parametrize("sparse", [True, False])
def test_residual_update_is_the_normalised_residual(sparse):
    rng = np.random.default_rng(1)
    vocab = 13
    for trial in range(20):
        p = rng.gamma(0.4, size=vocab) + (trial % 2) * 1e-3
        p = jnp.asarray(p / p.sum(), jnp.float32)
        q = _random_sparse(rng, (), vocab, width=6, nnz=4)
        # The residual of a residual: the second step starts from an unnormalised (r, z).
        r, z = residual_update(p, jnp.float32(1.0), q if sparse else q_dense(q), jnp.array(True))
        np.testing.assert_allclose(float(z), float(jnp.sum(r)), rtol=1e-6)
        want = residual(p, q_dense(q))
        np.testing.assert_allclose(np.asarray(r / z), np.asarray(want), atol=1e-6)
        q2 = _random_sparse(rng, (), vocab, width=6, nnz=2)
        r2, z2 = residual_update(r, z, q2 if sparse else q_dense(q2), jnp.array(True))
        np.testing.assert_allclose(
            np.asarray(r2 / z2), np.asarray(residual(want, q_dense(q2))), atol=1e-5
        )
        same, z_same = residual_update(r, z, q2 if sparse else q_dense(q2), jnp.array(False))
        np.testing.assert_array_equal(np.asarray(same), np.asarray(r))
        assert float(z_same) == float(z)
    # No mass left (q = p): r is kept, as `residual` keeps p.
    p = jnp.array([0.0, 0.25, 0.75, 0.0], jnp.float32)
    q = SparseQ(ids=jnp.array([2, 4, 1]), vals=jnp.array([0.75, 0.0, 0.25]), vocab=4)
    r, z = residual_update(p, jnp.float32(1.0), q if sparse else q_dense(q), jnp.array(True))
    np.testing.assert_array_equal(np.asarray(r), np.asarray(p))
    assert float(z) == 1.0


def _block(rng, s, gamma, vocab, width):
    p_root = rng.gamma(0.5, size=vocab) + 1e-4
    p_nodes = rng.gamma(0.5, size=(s, gamma, vocab)) + 1e-4
    q = _random_sparse(rng, (s, gamma), vocab, width, nnz=int(rng.integers(1, width + 1)))
    dense = np.asarray(q_dense(q))
    drafts = np.array(
        [[rng.choice(vocab, p=dense[k, j]) for j in range(gamma)] for k in range(s)], np.int32
    )
    if s > 1 and rng.random() < 0.5:  # chains that agree on their first drafts
        drafts[1, :2] = drafts[0, :2]
    active = rng.random(s) < 0.8
    active[rng.integers(s)] = True
    return (
        jnp.asarray(p_root / p_root.sum(), jnp.float32),
        jnp.asarray(p_nodes / p_nodes.sum(-1, keepdims=True), jnp.float32),
        q,
        jnp.asarray(drafts),
        jnp.asarray(active),
    )


@pytest.mark.parametrize(
    "rule,s", [(r.name, 1 if r.one_chain else 3) for r in registry.all_rules()]
)
def test_every_rule_gives_the_same_verdict_for_sparse_and_dense_q(rule, s):
    rng = np.random.default_rng(zlib.crc32(rule.encode()))
    fn = jax.jit(registry.get(rule).verify)
    gamma, vocab = 3, 17
    for trial in range(60):
        p_root, p_nodes, q, drafts, active = _block(rng, s, gamma, vocab, width=5)
        if registry.get(rule).coupled:
            g = jax.random.gumbel(jax.random.key(trial), (gamma + 1, vocab))
            # The coupled rules need Gumbel-max drafts of q with the same noise.
            dense = q_dense(q)
            tgt = jnp.argmax(jnp.log(dense) + g[None, :gamma], -1).astype(jnp.int32)
            drafts = jnp.where(jnp.arange(gamma)[None, :] < 2, tgt, drafts)
            key = jax.random.key(trial + 1000)
        else:
            g, key = None, jax.random.key(trial)
        got = fn(key, p_root, p_nodes, q, drafts, active, g)
        want = fn(key, p_root, p_nodes, q_dense(q), drafts, active, g)
        for field in ("n", "tokens", "path_slot", "accepted", "rejected", "matched", "cut_at"):
            np.testing.assert_array_equal(
                np.asarray(getattr(got, field)), np.asarray(getattr(want, field)), err_msg=field
            )
        np.testing.assert_array_equal(
            np.asarray(got.own_first_rejection), np.asarray(want.own_first_rejection)
        )


def _sparse_tables(q_tabs, width, seed):
    """The control drafters' tables with each row's mass on `width` of V ids (others 0)."""
    rng = np.random.default_rng(seed)
    q = np.array(q_tabs, np.float64)
    for k in range(q.shape[0]):
        for a in range(q.shape[1]):
            off = rng.choice(q.shape[2], q.shape[2] - width, replace=False)
            q[k, a, off] = 0.0
    return q / q.sum(-1, keepdims=True)


def _as_sparse(q, width):
    """Dense q f32[S, γ, V] (≤ width ids with mass per row) → SparseQ of that width."""
    vocab = q.shape[-1]
    ids = jnp.argsort(q <= 0, axis=-1, stable=True)[..., :width].astype(jnp.int32)
    vals = jnp.take_along_axis(q, ids, axis=-1)
    return SparseQ(ids=jnp.where(vals > 0, ids, vocab), vals=vals, vocab=vocab)


def _sparse_rule(rule, width):
    def run(key, p_root, p_nodes, q, drafts, active):
        return rule(key, p_root, p_nodes, _as_sparse(q, width), drafts, active)

    return run


def _lossy_update(r, z, q, apply):
    """LOSSY residual step: the sentinel padding read as id V − 1 (clipped gathers and
    scatters), so every chain's residual also takes mass off the last id."""
    ids = jnp.minimum(q.ids, q.vocab - 1)
    r_ids = r[ids]
    new = jnp.maximum(r_ids - z * jnp.where(q.ids < q.vocab, q.vals, 0.5), 0.0)
    cand = r.at[ids].set(new)
    z_new = jnp.sum(cand)
    ok = apply & (z_new > 0)
    return jnp.where(ok, cand, r), jnp.where(ok, z_new, z)


@pytest.mark.parametrize(
    "name,rule,chains,lossless",
    [
        ("token_tree, 3 chains, sparse q", rules.token_tree, 3, True),
        ("shared_block, 3 chains, sparse q", rules.shared_block, 3, True),
        ("NEGATIVE token_tree, padding read as an id", "lossy", 3, False),
    ],
)
def test_chi2_with_sparse_laws(name, rule, chains, lossless, monkeypatch):
    width = 3
    v_logits, p_tab, q_tabs = _control_tables()
    q_tabs = _sparse_tables(q_tabs, width, seed=5)
    if rule == "lossy":
        monkeypatch.setattr(rules, "residual_update", _lossy_update)
        rule = rules.token_tree
    seqs = rule_level_generate(
        _sparse_rule(rule, width + 1),  # one padding entry per row
        p_tab,
        q_tabs[:chains],
        N,
        LENGTH,
        gamma=2,
        seed=zlib.crc32(name.encode()),
    )
    p_value = chi2_pvalue(seqs, reference_law(v_logits, 1.0, START, LENGTH))
    print(f"\n{name}: χ² p = {p_value:.3g}")
    if lossless:
        assert p_value >= ALPHA, f"{name}: χ² rejects (p = {p_value:.3g})"
    else:
        assert p_value < ALPHA, f"{name}: the harness did not reject (p = {p_value:.3g})"


@pytest.mark.slow  # CI time (make test ≤ 15 min on a cold clone); `make test-all` runs it
def test_engine_sparse_and_dense_q_give_the_same_tokens():
    from test_eagle import KEEPS, _eagle, _verifier  # a feature drafter's setup

    from specjax.engine import drafting
    from specjax.engine.generate import row_keys_for, speculative_generate
    from specjax.engine.spec import DrafterSpec, EngineConfig, feature_maps, identity_maps
    from specjax.models.ngram import PromptLookupLM

    v_lm, v_params = _verifier()
    lm, params = _eagle(v_lm, v_params, KEEPS[0], seed=1)
    vocab = v_lm.vocab_size
    look = PromptLookupLM(vocab, 64)
    specs = [DrafterSpec("eagle", lm, temperature=1.0), DrafterSpec("lookup", look)]
    data = [feature_maps(params, vocab), identity_maps(look.init_params(), vocab)]
    statics = [d.static for d in specs]
    sparse_cfg = EngineConfig(n_slots=2, rule="token_tree", q_layout="sparse")
    assert drafting.call_q_width(sparse_cfg, statics, data, vocab) == len(KEEPS[0])
    assert drafting.call_q_width(EngineConfig(), statics[1:], data[1:], vocab) is None
    assert drafting.call_q_width(sparse_cfg, statics[1:], data[1:], vocab) == 1  # lookup
    n = 64
    prompts = [[START, 2, 3]] * n

    def run(layout):
        out = {}
        for rule, slots_n in (("token_tree", 2), ("rejection", 1)):
            cfg = EngineConfig(
                gamma=3,
                rule=rule,
                verifier_temperature=1.0,
                n_slots=slots_n,
                max_new_tokens=6,
                q_layout=layout,
            )
            res = speculative_generate(
                cfg,
                v_lm,
                v_params,
                specs[:slots_n] if slots_n == 2 else specs[:1],
                data[:slots_n] if slots_n == 2 else data[:1],
                prompts,
                [prompts] * slots_n,
                row_keys_for(3, n),
            )
            out[rule] = (np.asarray(res.tokens), jax.tree_util.tree_leaves(res.counters))
        return out

    sparse, dense = run("sparse"), run("dense")
    with pytest.raises(ConfigError, match=r"q_layout: got 'coo'; allowed: one of dense, sparse"):
        EngineConfig(q_layout="coo")
    for rule in sparse:
        np.testing.assert_array_equal(sparse[rule][0], dense[rule][0], err_msg=rule)
        for a, b in zip(sparse[rule][1], dense[rule][1]):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=rule)
