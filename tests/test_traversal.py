"""Traversal verification (`specjax.verify.traversal`, Weng et al. 2025) is exact.

Four layers, each able to fail:

* an independent float64 NumPy reference of the rule's outcome law for a fan of S chains
  (`_traversal_law`, built on tests/test_block_verification.py's `_block_law`), checked
  exact by enumeration: over every draft tree of small random context-dependent models —
  chains of different drafters, and twins whose heads are drawn without replacement in slot
  order — every output prefix has the target's probability;
* the jitted rule against that reference: for fixed trees (random, one-hot q, a sparse q,
  an inactive slot), the law of (winning chain, drafts kept, next token) over 200,000 keys,
  Pearson's χ² at α = 1e-3; on one chain it is `block_verification` bit for bit;
* the rule-level χ² harness of tests/test_lossless.py, which accepts the rule on three
  chains and rejects a lossy variant (the root's law not updated after a rejected chain);
* the engine: the registry puts it in every `RULES_SLOTS` suite (tests/test_verify.py: χ²
  and greedy equality; tests/test_lossless.py: verifier τ and filters; sparse q, prompt
  lookup, subset vocabularies); here twins without replacement in every slot order (χ²),
  and a plan run with `PlanConfig(rule='traversal')` equal to the verifier's greedy text.
"""

from __future__ import annotations

import dataclasses
import itertools
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from lossless_reference import reference_law
from scipy import stats
from test_block_verification import _block_law, _tree
from test_lossless import _control_tables, rule_level_generate
from test_twins import KEEPS, ORDERS, V, _check, _eagle, _run, _verifier
from test_verify import ALPHA, LENGTH, START, N, chi2_test

from specjax import testing as suite
from specjax.engine.spec import DrafterSpec, EngineConfig, feature_maps
from specjax.errors import ConfigError
from specjax.policy import engine_calls
from specjax.policy.plan import run_plans
from specjax.policy.plan_config import PlanConfig
from specjax.policy.switches import Policy
from specjax.verify import registry, rules
from specjax.verify import traversal as traversal_mod
from specjax.verify.qlaw import on_ids

# ----------------------------------------------------------------------------------------
# The reference (float64 NumPy; shares no code with the rule)
# ----------------------------------------------------------------------------------------


def _residual(r, q):
    out = np.maximum(r - q, 0.0)
    return out / out.sum() if out.sum() > 0 else r


def _traversal_law(chains, p_root, update_root=True):
    """{(chain or None, drafts kept, next token): probability} of one round.

    `chains`: per active chain in slot order, (ps, qs, x, g): ps the g + 1 target laws
    after 0..g of its drafts (ps[0] unused: the root's law at its turn), qs the g laws its
    drafts were drawn from, x its drafts. None: every chain was rejected. `update_root`
    False: the lossy variant that verifies every chain against p itself."""
    out, alive, r = {}, 1.0, np.asarray(p_root, np.float64)
    for k, (ps, qs, x, g) in enumerate(chains):
        # Block verification against (r, then p); the lossy variant tests against p itself.
        root = r if update_root else np.asarray(p_root, np.float64)
        joint = _block_law([root] + list(ps[1:]), qs, x, g)
        for t in range(1, g + 1):
            for y in range(len(r)):
                out[(k, t, y)] = alive * joint[t, y]
        alive *= joint[0].sum()
        r = _residual(r, qs[0])  # the head rejected at the root
    for y in range(len(r)):
        out[(None, 0, y)] = alive * r[y]
    return out


def _without(law, ids):
    """A law with the ids `ids` removed and renormalised (all removed: the law itself)."""
    out = np.array(law, np.float64)
    out[list(ids)] = 0.0
    return out / out.sum() if out.sum() > 0 else np.array(law, np.float64)


def _round_reach(p, qs, vocab, gamma, n_chains, twins, update_root=True):
    """{output prefix: P(the round outputs at least it)} over every draft tree: chain k
    drafted from `qs[k]` (a dict keyed by prefix); with `twins` the heads are drawn without
    replacement of the heads before them (one drafter named `n_chains` times)."""
    reach = {}
    for flat in itertools.product(range(vocab), repeat=gamma * n_chains):
        xs = [flat[k * gamma : (k + 1) * gamma] for k in range(n_chains)]
        prob, chains = 1.0, []
        for k, x in enumerate(xs):
            q_laws = [qs[k][x[:i]] for i in range(gamma)]
            if twins:
                q_laws[0] = _without(q_laws[0], {xs[h][0] for h in range(k)})
            prob *= np.prod([q_laws[i][x[i]] for i in range(gamma)])
            chains.append(([p[x[:i]] for i in range(gamma + 1)], q_laws, x, gamma))
        if prob == 0:
            continue
        for (k, t, y), pr in _traversal_law(chains, p[()], update_root).items():
            seq = (xs[k][:t] if k is not None else ()) + (y,)
            for m in range(1, len(seq) + 1):
                reach[seq[:m]] = reach.get(seq[:m], 0.0) + prob * pr
    return reach


def _laws(rng, vocab, gamma, n_chains, twins):
    p, q0 = _tree(rng, vocab, gamma)
    others = [q0 if twins else _tree(rng, vocab, gamma)[1] for _ in range(1, n_chains)]
    return p, [q0] + others


@pytest.mark.parametrize(
    "vocab,gamma,n_chains,twins,seed",
    [(3, 2, 2, False, 0), (3, 2, 3, False, 1), (3, 2, 2, True, 2), (3, 2, 3, True, 3)],
)
def test_reference_is_exact(vocab, gamma, n_chains, twins, seed):
    p, qs = _laws(np.random.default_rng(seed), vocab, gamma, n_chains, twins)
    reach = _round_reach(p, qs, vocab, gamma, n_chains, twins)
    # Valid: P(output ⊇ y_1..y_k) / p(y_k | y_<k) does not depend on y_k (the first token
    # has the target's law itself).
    for y in range(vocab):
        assert abs(reach[(y,)] - p[()][y]) < 1e-12
    for k in range(2, gamma + 2):
        for pre in itertools.product(range(vocab), repeat=k - 1):
            ratio = [reach.get(pre + (y,), 0.0) / p[pre][y] for y in range(vocab)]
            assert max(ratio) - min(ratio) < 1e-12, (pre, ratio)


def test_the_enumeration_rejects_a_lossy_variant():
    """Every chain tested against p itself instead of the root's current law (the rejected
    chains' residual not carried into the next chain's test): the first token's law is off,
    so the check above has power."""
    vocab, gamma = 3, 2
    p, qs = _laws(np.random.default_rng(4), vocab, gamma, 2, False)
    reach = _round_reach(p, qs, vocab, gamma, 2, False, update_root=False)
    assert max(abs(reach[(y,)] - p[()][y]) for y in range(vocab)) > 1e-3


# ----------------------------------------------------------------------------------------
# The jitted rule against the reference
# ----------------------------------------------------------------------------------------

M = 200_000


def _fan(kind, rng, s=3, vocab=6, gamma=3):
    """(p_root f[V], p_nodes f[S, γ, V], q f[S, γ, V], drafts i[S, γ], active bool[S])."""
    p_root = rng.dirichlet(np.full(vocab, 0.6))
    p_nodes = rng.dirichlet(np.full(vocab, 0.6), size=(s, gamma))
    q = rng.dirichlet(np.full(vocab, 0.6), size=(s, gamma))
    if kind == "one_hot_q":  # a greedy drafter in the middle slot (the only one of one)
        q[s // 2] = np.eye(vocab)[rng.integers(0, vocab, gamma)]
    if kind == "shared_head":  # two chains of one law whose heads agree
        q[1] = q[0]
    x = np.array([[rng.choice(vocab, p=q[k, i]) for i in range(gamma)] for k in range(s)])
    if kind == "shared_head":
        x[1, 0] = x[0, 0]
    active = np.ones(s, bool)
    if kind == "inactive_slot":
        active[1] = False
    return p_root, p_nodes, q, x, active


def _reference(p_root, p_nodes, q, x, active):
    """f64[S + 1, γ + 1, V]: P(winning slot (S: none), drafts kept, next token)."""
    s, gamma, vocab = q.shape
    slots = [k for k in range(s) if active[k]]
    chains = [([p_root] + list(p_nodes[k]), list(q[k]), x[k], gamma) for k in slots]
    out = np.zeros((s + 1, gamma + 1, vocab))
    for (k, t, y), pr in _traversal_law(chains, p_root).items():
        out[s if k is None else slots[k], t, y] += pr
    return out


def _outcomes(p_root, p_nodes, q, x, active, seed, n=M):
    keys = jax.random.split(jax.random.key(seed), n)
    f = jax.jit(jax.vmap(traversal_mod.traversal, in_axes=(0, None, None, None, None, None)))
    v = f(
        keys,
        jnp.asarray(p_root, jnp.float32),
        jnp.asarray(p_nodes, jnp.float32),
        q,
        jnp.asarray(x, jnp.int32),
        jnp.asarray(active),
    )
    kept = np.asarray(v.n)
    win = np.where(kept > 0, np.asarray(v.path_slot)[:, 0], x.shape[0])
    return win, kept, np.asarray(v.tokens)[np.arange(n), kept]


@pytest.mark.parametrize(
    "kind", ["random", "one_hot_q", "shared_head", "inactive_slot", "sparse_q"]
)
def test_rule_has_the_reference_outcome_law(kind):
    rng = np.random.default_rng(zlib.crc32(f"traversal/{kind}".encode()))
    p_root, p_nodes, q, x, active = _fan(kind, rng)
    s, gamma, vocab = q.shape
    want = _reference(p_root, p_nodes, q, x, active)
    qj = jnp.asarray(q, jnp.float32)
    if kind == "sparse_q":  # the same law held on its support
        qj = on_ids(qj, jnp.arange(vocab, dtype=jnp.int32), vocab)
    win, kept, final = _outcomes(p_root, p_nodes, qj, x, active, zlib.crc32(kind.encode()))
    obs = np.bincount((win * (gamma + 1) + kept) * vocab + final, minlength=want.size)
    exp = want.ravel() * M
    assert obs[exp == 0].sum() == 0, "an outcome of probability 0 was drawn"
    big = exp >= 5
    obs_b, exp_b = np.append(obs[big], obs[~big].sum()), np.append(exp[big], exp[~big].sum())
    keep = exp_b > 0
    assert big.sum() >= 10, f"{kind}: a degenerate case"
    p_value = stats.chisquare(obs_b[keep], exp_b[keep]).pvalue
    print(kind, f"p = {p_value:.3g}")
    assert p_value >= ALPHA, f"{kind}: the rule's outcome law is not the reference's"


def test_one_chain_is_block_verification_bit_for_bit():
    rng = np.random.default_rng(9)
    f_t = jax.jit(traversal_mod.traversal)
    f_b = jax.jit(rules.block_verification)
    for trial in range(40):
        p_root, p_nodes, q, x, active = _fan("one_hot_q" if trial % 4 == 0 else "random", rng, s=1)
        args = (
            jnp.asarray(p_root, jnp.float32),
            jnp.asarray(p_nodes, jnp.float32),
            jnp.asarray(q, jnp.float32),
            jnp.asarray(x, jnp.int32),
            jnp.asarray(active),
        )
        a, b = f_t(jax.random.key(trial), *args), f_b(jax.random.key(trial), *args)
        for field in ("n", "tokens", "accepted", "rejected", "matched", "own_first_rejection"):
            np.testing.assert_array_equal(
                np.asarray(getattr(a, field)), np.asarray(getattr(b, field)), err_msg=field
            )


# ----------------------------------------------------------------------------------------
# The χ² harness of tests/test_lossless.py: accepts the rule, rejects a lossy one
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("lossless", [True, False], ids=["traversal (exact)", "NEGATIVE"])
def test_chi2_harness_accepts_the_rule_and_rejects_a_lossy_variant(lossless, monkeypatch):
    """Three chains at γ 2; the NEGATIVE variant never updates the root's law after a
    rejected chain (every chain tested against p, the last token drawn from p)."""
    if not lossless:
        monkeypatch.setattr(traversal_mod, "residual_update", lambda r, z, q, apply: (r, z))

    def rule(*args):  # a new function: traced now (the harness's jit caches by the rule)
        return traversal_mod.traversal(*args)

    v_logits, p_tab, q_tabs = _control_tables()
    name = f"traversal/{lossless}"
    seqs = rule_level_generate(
        rule, p_tab, q_tabs, N, LENGTH, gamma=2, seed=zlib.crc32(name.encode())
    )
    stat, df, p_value, log10p = chi2_test(seqs, reference_law(v_logits, 1.0, START, LENGTH))
    print(f"\n{name}: χ² = {stat:.1f} on {df} df, log10 p = {log10p:.1f}")
    assert (p_value >= ALPHA) == lossless


# ----------------------------------------------------------------------------------------
# The engine: twins without replacement, and a plan that names the rule
# ----------------------------------------------------------------------------------------


@pytest.mark.slow  # CI time (make test ≤ 15 min on a cold clone); `make test-all` runs it
def test_feature_twins_are_lossless_in_every_slot_order():
    """Twins' heads drawn without replacement in each row's slot order (the registry says
    the rule allows it), rows holding the twins in every order and leaving some out."""
    assert registry.get("traversal").twins_without_replacement
    v_lm, v_params = _verifier()
    lm, params = _eagle(v_lm, v_params, KEEPS[0], seed=10, scale=4.0)
    data = feature_maps(params, V)
    specs = [DrafterSpec("e", lm, temperature=t) for t in (1.0, 1.0, 0.7)]
    slots = ORDERS[np.arange(N) % len(ORDERS)]
    cfg = EngineConfig(
        gamma=2, rule="traversal", verifier_temperature=1.0, n_slots=3, max_new_tokens=LENGTH
    )
    res = _run(cfg, v_lm, v_params, specs, [data] * 3, zlib.crc32(b"traversal/twins"), slots=slots)
    c = _check("feature twins, traversal", res, v_lm, v_params)
    assert (c.accepted.sum(0) > 0).all()  # every twin's chain wins somewhere


def test_a_plan_config_naming_the_rule_runs_it_and_stays_greedy(monkeypatch):
    """`PlanConfig(rule='traversal')`: sets of several drafters run it (switch 2 on; off:
    the naive shared block), one-drafter branches block verification; at verifier τ 0 every
    plan commits the verifier's greedy text (the verifier alone, `run_plans` without a
    policy)."""
    dep, _ = suite.make_deployment("random", seed=7, fourth=True)
    cfg = PlanConfig(gamma=3, verifier_temperature=0.0, plan_steps=2, max_step_tokens=6, bucket=16)
    prompts = ["ab", "c", "dda", "b"]
    greedy = run_plans(dep, cfg, prompts)[0]
    seen = []
    real = engine_calls.EngineConfig

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        seen.append((out.rule, out.n_slots))
        return out

    monkeypatch.setattr(engine_calls, "EngineConfig", spy)
    cfg = dataclasses.replace(cfg, rule="traversal")
    # One set of every drafter, switch 2 on (traversal) and off (the naive shared block);
    # all on: sets of one drafter (tokenizer groups, the KL ceiling).
    on = Policy.from_name("naive_plus_truncate_and_attribute")
    for pol in (on, Policy.naive(), Policy.all_on()):
        texts, _ = run_plans(dep, cfg, prompts, policy=pol)
        assert texts == greedy, pol.name
    multi = {r for r, s in seen if s > 1}
    assert "traversal" in multi and multi <= {"traversal", "shared_block"}
    assert {r for r, s in seen if s == 1} <= {"block_verification"}
    with pytest.raises(ConfigError, match="rule"):
        PlanConfig(rule="token_tree")  # not a plan's rule: None is
