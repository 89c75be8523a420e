"""Block verification (`rules.block_verification`, Sun et al., ICLR 2025) is exact and
commits at least as many drafts as token-level rejection.

Three layers, each able to fail:

* an independent float64 NumPy reference of the rule's outcome law for one draft chain
  (`_block_law`), checked exact by enumeration: over every draft chain of small random
  context-dependent models, every output prefix has the target's probability (the
  criterion that lets rounds concatenate), its expected length is never below rejection's,
  and on the paper's two-token example it is 11/9 drafts per round against 10/9;
* the jitted rule against that reference: for fixed chains (random, one-hot q, a chain
  shorter than γ, a sparse q), the law of (drafts kept, next token) over 200,000 keys,
  Pearson's χ² at α = 1e-3; and its mean on the paper's example;
* the rule-level χ² harness of tests/test_lossless.py at γ = 3, which accepts the rule and
  rejects a lossy variant (the residual without the prefix weight); the engine-level χ²,
  greedy and filter suites run it through `RULES_SLOTS` (tests/test_verify.py).
"""

from __future__ import annotations

import itertools
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from lossless_reference import reference_law
from scipy import stats
from test_lossless import _control_tables, rule_level_generate
from test_verify import ALPHA, START, N, chi2_test

from specjax.verify import rules
from specjax.verify.qlaw import on_ids
from specjax.verify.streams import key_data, sample_rows_u, split_data, uniform_data

# ----------------------------------------------------------------------------------------
# The reference (float64 NumPy; shares no code with the rule)
# ----------------------------------------------------------------------------------------


def _block_law(p, q, x, g):
    """f64[g+1, V]: P(τ = t drafts kept, next token = y) for the chain `x` of length g.
    `p`: g+1 target laws (after 0..g drafts), `q`: g draft laws."""
    w = [1.0]
    for i in range(g):
        a = w[-1] * p[i][x[i]]
        w.append(min(1.0, a / q[i][x[i]]) if q[i][x[i]] > 0 else float(a > 0))
    h = [None]
    for i in range(1, g):
        r = np.maximum(w[i] * p[i] - q[i], 0).sum()
        den = r + 1 - w[i]
        h.append(r / den if den > 0 else 0.0)
    h.append(w[g])
    out = np.zeros((g + 1, len(p[0])))
    for t in range(g + 1):
        pr = (h[t] if t > 0 else 1.0) * np.prod([1 - h[j] for j in range(t + 1, g + 1)])
        if t == g:
            law = p[g]
        else:
            r = np.maximum(w[t] * p[t] - q[t], 0)
            law = r / r.sum() if r.sum() > 0 else p[t]
        out[t] = pr * law
    return out


def _token_law(p, q, x, g):
    """The same for Leviathan's token-level rejection (the baseline)."""
    acc = [min(1.0, p[i][x[i]] / q[i][x[i]]) for i in range(g)]
    out = np.zeros((g + 1, len(p[0])))
    for t in range(g + 1):
        pr = np.prod(acc[:t]) * (1 - acc[t] if t < g else 1.0)
        law = p[g] if t == g else np.maximum(p[t] - q[t], 0)
        out[t] = pr * law / law.sum() if law.sum() > 0 else 0
    return out


def _tree(rng, vocab, gamma, conc=0.7):
    """Random context-dependent target and draft laws, keyed by the prefix."""
    p, q = {}, {}
    for k in range(gamma + 1):
        for pre in itertools.product(range(vocab), repeat=k):
            p[pre] = rng.dirichlet(np.full(vocab, conc))
            q[pre] = rng.dirichlet(np.full(vocab, conc))
    return p, q


def _round_law(law_fn, p, q, vocab, gamma):
    """{output prefix: P(the round outputs at least that prefix)} over every draft chain."""
    reach = {}
    for x in itertools.product(range(vocab), repeat=gamma):
        px = np.prod([q[x[:i]][x[i]] for i in range(gamma)])
        ps = [p[x[:i]] for i in range(gamma + 1)]
        qs = [q[x[:i]] for i in range(gamma)]
        joint = law_fn(ps, qs, x, gamma)
        for t in range(gamma + 1):
            for y in range(vocab):
                seq = x[:t] + (y,)
                for k in range(1, t + 2):
                    reach[seq[:k]] = reach.get(seq[:k], 0.0) + px * joint[t, y]
    return reach


@pytest.mark.parametrize("vocab,gamma,seed", [(3, 2, 0), (3, 3, 1), (4, 3, 2), (3, 4, 3)])
def test_reference_is_exact_and_never_below_rejection(vocab, gamma, seed):
    p, q = _tree(np.random.default_rng(seed), vocab, gamma)
    lengths = {}
    for name, fn in (("block", _block_law), ("token", _token_law)):
        reach = _round_law(fn, p, q, vocab, gamma)
        # Valid: P(output ⊇ y_1..y_k) / p(y_k | y_<k) does not depend on y_k.
        for k in range(1, gamma + 2):
            for pre in itertools.product(range(vocab), repeat=k - 1):
                ratio = [reach.get(pre + (y,), 0.0) / p[pre][y] for y in range(vocab)]
                assert max(ratio) - min(ratio) < 1e-12, (name, pre, ratio)
        lengths[name] = sum(reach.values())  # E[tokens per round] = Σ_k P(length ≥ k)
    assert lengths["block"] >= lengths["token"] - 1e-12
    assert lengths["block"] > lengths["token"] + 1e-3  # a strict gain on random models


def test_reference_gives_the_papers_example():
    """Sun et al.'s example: V = {a, b}, p = (1/3, 2/3), q = (2/3, 1/3), γ = 2."""
    p = {
        pre: np.array([1 / 3, 2 / 3])
        for g in range(3)
        for pre in itertools.product(range(2), repeat=g)
    }
    q = {pre: np.array([2 / 3, 1 / 3]) for pre in p}
    assert abs(sum(_round_law(_block_law, p, q, 2, 2).values()) - (1 + 11 / 9)) < 1e-12
    assert abs(sum(_round_law(_token_law, p, q, 2, 2).values()) - (1 + 10 / 9)) < 1e-12


# ----------------------------------------------------------------------------------------
# The jitted rule against the reference
# ----------------------------------------------------------------------------------------

M = 200_000


def _outcomes(rule, p_root, p_nodes, q, drafts, seed, n=M):
    keys = jax.random.split(jax.random.key(seed), n)
    f = jax.jit(jax.vmap(rule, in_axes=(0, None, None, None, None, None)))
    v = f(keys, p_root, p_nodes, q, drafts, jnp.array([True]))
    n_kept = np.asarray(v.n)
    final = np.asarray(v.tokens)[np.arange(n), n_kept]
    return n_kept, final


def _case(kind, rng, vocab=6, gamma=3):
    """(p_root, p_nodes, q (dense, zero rows past g), drafts, g, laws for the reference)."""
    p = rng.dirichlet(np.full(vocab, 0.6), size=gamma + 1)
    q = rng.dirichlet(np.full(vocab, 0.6), size=gamma)
    g = gamma
    if kind == "one_hot_q":
        q = np.eye(vocab)[rng.integers(0, vocab, gamma)]
    if kind == "short_chain":
        g = gamma - 1
    x = np.array([rng.choice(vocab, p=q[i]) for i in range(gamma)])
    if kind == "short_chain":
        q[g:] = 0.0
    return p, q, x, g


def _block_args(p, q, x):
    """One chain's block for a rule (after its key): p f[γ+1, V], q f[γ, V], drafts x i[γ]."""
    return (
        jnp.asarray(p[0], jnp.float32),
        jnp.asarray(p[None, 1:], jnp.float32),
        jnp.asarray(q[None], jnp.float32),
        jnp.asarray(x[None], jnp.int32),
        jnp.array([True]),
    )


@pytest.mark.parametrize("kind", ["random", "one_hot_q", "short_chain", "sparse_q"])
def test_rule_has_the_reference_outcome_law(kind):
    rng = np.random.default_rng(zlib.crc32(kind.encode()))
    p, q, x, g = _case(kind, rng)
    vocab = p.shape[1]
    want = _block_law(list(p), list(q), x, g)
    qj = jnp.asarray(q[None], jnp.float32)
    if kind == "sparse_q":  # the same law held on its support
        ids = jnp.arange(vocab, dtype=jnp.int32)
        qj = on_ids(qj, ids, vocab)
    p_root, p_nodes, _, drafts, _ = _block_args(p, q, x)
    n_kept, final = _outcomes(
        rules.block_verification,
        p_root,
        p_nodes,
        qj,
        drafts,
        seed=zlib.crc32(f"bv/{kind}".encode()),
    )
    assert n_kept.max() <= g
    obs = np.bincount(n_kept * vocab + final, minlength=(g + 1) * vocab)
    exp = want.ravel() * M
    assert obs[exp == 0].sum() == 0, "an outcome of probability 0 was drawn"
    big = exp >= 5
    obs_b, exp_b = np.append(obs[big], obs[~big].sum()), np.append(exp[big], exp[~big].sum())
    keep = exp_b > 0
    assert keep.sum() >= 2, f"{kind}: a degenerate case (one possible outcome)"
    p_value = stats.chisquare(obs_b[keep], exp_b[keep]).pvalue
    print(kind, f"p = {p_value:.3g}")
    assert p_value >= ALPHA, f"{kind}: the rule's outcome law is not the reference's"


def test_rule_commits_the_papers_11_over_9():
    """Drafts drawn from q each round; mean drafts kept 11/9 (rejection: 10/9)."""
    p = jnp.asarray([1 / 3, 2 / 3], jnp.float32)
    q = jnp.asarray([2 / 3, 1 / 3], jnp.float32)
    keys = jax.random.split(jax.random.key(5), M)

    def one(key, rule):
        kd, kr = jax.random.split(key)
        drafts = jax.random.categorical(kd, jnp.log(q), shape=(1, 2)).astype(jnp.int32)
        return rule(
            kr,
            p,
            jnp.broadcast_to(p, (1, 2, 2)),
            jnp.broadcast_to(q, (1, 2, 2)),
            drafts,
            jnp.array([True]),
        ).n

    for rule, want in ((rules.block_verification, 11 / 9), (rules.rejection, 10 / 9)):
        n = np.asarray(jax.jit(jax.vmap(lambda k, r=rule: one(k, r)))(keys))
        se = n.std() / np.sqrt(M)
        assert abs(n.mean() - want) < 4 * se, (rule.__name__, n.mean(), want)


def test_one_hot_target_commits_what_rejection_commits():
    """Verifier τ 0: the weights are 1 up to the first mismatch, so both rules keep the
    same drafts and give the greedy token (the engine's greedy suite runs it end to end)."""
    rng = np.random.default_rng(3)
    vocab, gamma = 7, 4
    f_block = jax.jit(rules.block_verification)
    f_rej = jax.jit(rules.rejection)
    for trial in range(100):
        q = rng.dirichlet(np.ones(vocab), size=gamma)
        if trial % 3 == 0:  # a greedy drafter
            q = np.eye(vocab)[rng.integers(0, vocab, gamma)]
        x = np.array([rng.choice(vocab, p=q[i]) for i in range(gamma)])  # drafts from q
        # The verifier's greedy token: the draft's with probability 0.6, else any.
        top = np.where(
            rng.random(gamma + 1) < 0.6, np.append(x, 0), rng.integers(0, vocab, gamma + 1)
        )
        p = np.eye(vocab)[top]
        args = _block_args(p, q, x)
        a, b = f_block(jax.random.key(trial), *args), f_rej(jax.random.key(trial + 7), *args)
        assert int(a.n) == int(b.n)
        np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))


# ----------------------------------------------------------------------------------------
# The χ² harness of tests/test_lossless.py at γ = 3: accepts the rule, rejects a lossy one
# ----------------------------------------------------------------------------------------


def unweighted_residual(key, p_root, p_nodes, q, drafts, active):
    """LOSSY: block verification's pass tests, but the next token from max(0, p − q) (the
    token-level residual) instead of max(0, w·p − q)."""
    v = rules.block_verification(key, p_root, p_nodes, q, drafts, active)
    gamma = q.shape[1]
    tau = v.n
    p_all = jnp.concatenate([p_root[None], p_nodes[0]], 0)
    q_tau = q[0, jnp.minimum(tau, gamma - 1)]
    r = jnp.maximum(p_all[tau] - q_tau, 0.0)
    dist = jnp.where((tau < gamma) & (jnp.sum(r) > 0), r, p_all[tau])
    k = split_data(key_data(jax.random.fold_in(key, 1)), 1)[0]
    final = sample_rows_u(uniform_data(k), dist)
    return v.replace(tokens=v.tokens.at[tau].set(final))


@pytest.mark.parametrize(
    "name,rule,lossless",
    [
        ("block_verification (exact)", rules.block_verification, True),
        ("NEGATIVE residual without the prefix weight", unweighted_residual, False),
    ],
)
def test_chi2_harness_at_gamma_3(name, rule, lossless):
    length = 4
    v_logits, p_tab, q_tabs = _control_tables(seed=12)
    seqs = rule_level_generate(
        rule, p_tab, q_tabs[:1], N, length, gamma=3, seed=zlib.crc32(name.encode())
    )
    stat, df, p_value, _ = chi2_test(seqs, reference_law(v_logits, 1.0, START, length))
    print(f"\n{name}: χ² = {stat:.1f} on {df} df, p = {p_value:.3g}")
    if lossless:
        assert p_value >= ALPHA
    else:
        assert p_value < ALPHA


@pytest.mark.parametrize("kind", ["random", "one_hot_q", "short_chain"])
def test_expected_kept_is_the_reference_mean(kind):
    """`kept_expected` / `kept_rule1`: each rule's mean drafts kept given the block, as the
    reference computes them, the same from `rejection`'s verdict for rule 1."""
    rng = np.random.default_rng(zlib.crc32(f"kept/{kind}".encode()))
    p, q, x, g = _case(kind, rng)
    t = np.arange(g + 1)
    want = (_block_law(list(p), list(q), x, g).sum(1) * t).sum()
    want1 = (_token_law(list(p), list(q), x, g).sum(1) * t).sum()
    args = _block_args(p, q, x)
    v = jax.jit(rules.block_verification)(jax.random.key(0), *args)
    r = jax.jit(rules.rejection)(jax.random.key(0), *args)
    np.testing.assert_allclose(float(v.kept_expected), want, rtol=1e-5)
    np.testing.assert_allclose([float(v.kept_rule1), float(r.kept_expected)], want1, rtol=1e-5)
    assert float(r.kept_rule1) == float(r.kept_expected)
    # (On one chain either rule may expect more; the block rule's optimality is over the
    # drafts' law, test_reference_is_exact_and_never_below_rejection.)
