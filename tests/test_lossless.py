"""A losslessness suite that can fail (SPEC §3, §9): negative controls, every verifier
temperature, top-k / top-p drafters and verifiers, against an independent NumPy target.

Statistical design (as tests/test_verify.py): N = 100,000 vectorised rows per test, the
first 3 committed tokens after a fixed start token, Pearson's χ² against the exact law of
the verifier (cells with expected count < 5 pooled), fixed seeds, significance α = 1e-3.

* **Targets** are computed in float64 NumPy from the logits tables
  (tests/lossless_reference.py: `reference_probs`, `reference_law`), independently of `specjax.verify.distributions.
  sampling_probs` (the code under test).
* **Negative controls.** The χ² harness must reject the two known-lossy variants of the
  naive shared block (SPEC §4): resolving a tie at the cut with the primary chain's
  residual instead of a fresh sample of p, and discarding the whole block on any
  rejection. They run through a rule-level generator (the rules called directly, vmapped
  over the rows, several rounds until 3 tokens are committed) beside the real
  `shared_block` and `token_tree` in the same generator as positive controls, so the
  harness is shown to accept the exact rules and reject the lossy ones on the same data.
  Their p-values are printed (``pytest -s``).
* **Temperatures and filters** run end to end through the jitted engine: verifier
  τ ∈ {0.5, 2} (τ = 1 is tests/test_verify.py) for every rule, and drafters and verifiers
  with top-k and top-p filtering.
"""

from __future__ import annotations

import dataclasses
import functools
import zlib
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from lossless_reference import reference_law, reference_probs
from test_verify import ALPHA, LENGTH, RULES_SLOTS, START, N, chi2_pvalue, chi2_test

from specjax import testing as suite
from specjax.engine.generate import row_keys_for, speculative_generate
from specjax.engine.spec import EngineConfig
from specjax.verify import rules
from specjax.verify.distributions import residual, sample

# ----------------------------------------------------------------------------------------
# The independent reference (float64 NumPy; shares no code with specjax.verify)
# ----------------------------------------------------------------------------------------


def test_reference_matches_hand_computed_laws():
    """The reference itself, on cases small enough to do by hand."""
    logits = np.log(np.array([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8], [1 / 3, 1 / 3, 1 / 3]]))
    np.testing.assert_allclose(reference_probs(logits, 1.0)[0], [0.5, 0.3, 0.2])
    np.testing.assert_allclose(reference_probs(logits, 1.0, top_k=2)[0], [0.625, 0.375, 0])
    np.testing.assert_allclose(reference_probs(logits, 1.0, top_p=0.6)[0], [0.625, 0.375, 0])
    np.testing.assert_allclose(reference_probs(logits, 1.0, top_p=0.45)[0], [1, 0, 0])
    np.testing.assert_allclose(reference_probs(logits, 0.0)[1], [0, 0, 1])
    sq = np.array([0.25, 0.09, 0.04]) / 0.38
    np.testing.assert_allclose(reference_probs(logits, 0.5)[0], sq)
    law = reference_law(logits, 1.0, start=0, length=2)
    np.testing.assert_allclose(law[1, 2], 0.3 * 0.8)
    np.testing.assert_allclose(law[2, 0], 0.2 / 3)
    assert law.shape == (3, 3) and abs(law.sum() - 1) < 1e-12


@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (3, 1.0), (0, 0.7), (4, 0.8)])
def test_sampling_probs_runs_one_branch_and_gives_the_reference_law(top_k, top_p):
    """`sampling_probs` with one temperature (a `lax.cond`: only the greedy or the tempered
    branch runs) gives the reference law and what the per-row temperature form (both
    branches and a select) gives — eager, jitted with τ traced, and vmapped over rows with τ
    shared or batched: the same one-hot at τ 0, the same law to float32 rounding above
    (XLA fuses the softmax differently inside a branch: last-bit differences)."""
    from specjax.verify.distributions import sampling_probs

    rng = np.random.default_rng(7)
    logits = rng.normal(0, 2, (5, 9)).astype(np.float32)
    logits[0, 3] = logits[0, 6] = 9.0  # a tie: the lowest id wins at τ 0
    f = jax.jit(lambda x, t: sampling_probs(x, t, top_k=top_k, top_p=top_p))
    for t in (0.0, 0.5, 1.0, 1.3):
        want = reference_probs(logits, t, top_k=top_k, top_p=top_p)
        one = np.asarray(sampling_probs(jnp.asarray(logits), t, top_k=top_k, top_p=top_p))
        forms = [
            sampling_probs(jnp.asarray(logits), jnp.full((5, 1), t), top_k=top_k, top_p=top_p),
            f(logits, jnp.float32(t)),
            jax.vmap(f, in_axes=(0, None))(logits, jnp.float32(t)),
            jax.vmap(f)(logits, jnp.full((5,), t, jnp.float32)),
        ]
        np.testing.assert_allclose(one, want, rtol=1e-5, atol=1e-6)
        for other in forms:
            if t == 0:
                np.testing.assert_array_equal(np.asarray(other), one)
            else:
                np.testing.assert_allclose(np.asarray(other), one, rtol=1e-6, atol=1e-7)
    assert np.asarray(sampling_probs(jnp.asarray(logits), 0.0))[0, 3] == 1.0


# ----------------------------------------------------------------------------------------
# Negative controls: the rules called directly, several rounds per row
# ----------------------------------------------------------------------------------------


def ties_to_residual(key, p_root, p_nodes, q, drafts, active) -> Committed:
    """LOSSY: `shared_block` with a tie at the cut resolved by the primary's residual."""
    s, gamma, _ = q.shape
    k_u, k_tok = jax.random.split(key)
    p_before = rules._p_before(p_root, p_nodes)  # pylint: disable=protected-access
    first = rules._own_tests(  # pylint: disable=protected-access
        jax.random.uniform(k_u, (s, gamma)),
        rules._p_at(p_root, p_nodes, drafts),  # pylint: disable=protected-access
        q,
        drafts,
        active,
    )
    primary = jnp.argmax(active)
    cut = jnp.min(first)
    own_first = first[primary] == cut  # the lossy line: ties are not excluded
    cut_c = jnp.minimum(cut, gamma - 1)
    p_cut = p_before[primary, cut_c]
    dist = jnp.where(
        cut == gamma,
        p_nodes[primary, gamma - 1],
        jnp.where(own_first, residual(p_cut, q[primary, cut_c]), p_cut),
    )
    return _verdict(cut, drafts[primary], sample(k_tok, dist), gamma)


def whole_block_discard(key, p_root, p_nodes, q, drafts, active) -> Committed:
    """LOSSY: any rejection anywhere discards the whole block for one fresh sample of p."""
    s, gamma, _ = q.shape
    k_u, k_tok = jax.random.split(key)
    first = rules._own_tests(  # pylint: disable=protected-access
        jax.random.uniform(k_u, (s, gamma)),
        rules._p_at(p_root, p_nodes, drafts),  # pylint: disable=protected-access
        q,
        drafts,
        active,
    )
    primary = jnp.argmax(active)
    rejected = jnp.min(first) < gamma
    n = jnp.where(rejected, 0, gamma)
    dist = jnp.where(rejected, p_root, p_nodes[primary, gamma - 1])
    return _verdict(n, drafts[primary], sample(k_tok, dist), gamma)


class Committed(NamedTuple):
    """What the generator reads of a `rules.Verdict`: `n` drafts, then `tokens[n]`."""

    n: jax.Array
    tokens: jax.Array


def _verdict(n, chain, final, gamma) -> Committed:
    idx = jnp.arange(gamma + 1)
    tokens = jnp.where(idx < n, jnp.pad(chain, (0, 1)), 0)
    tokens = jnp.where(idx == n, final, tokens).astype(jnp.int32)
    return Committed(n=n.astype(jnp.int32), tokens=tokens)


@functools.partial(jax.jit, static_argnames=("rule", "gamma"))
def _round(key, last, p_tab, q_tabs, *, rule, gamma):
    """One round for every row: S chains of γ drafts from the q tables, then `rule`."""
    s = q_tabs.shape[0]
    n_rows = last.shape[0]
    k_draft, k_rule = jax.random.split(key)

    def draft(prev, k):  # prev: i32[N, S]
        q = q_tabs[jnp.arange(s)[None, :], prev]  # f32[N, S, V]
        tok = jax.random.categorical(k, jnp.log(q), axis=-1).astype(jnp.int32)
        return tok, (tok, q)

    init = jnp.broadcast_to(last[:, None], (n_rows, s))
    _, (drafts, q) = jax.lax.scan(draft, init, jax.random.split(k_draft, gamma))
    drafts = jnp.moveaxis(drafts, 0, 2)  # i32[N, S, γ]
    q = jnp.moveaxis(q, 0, 2)  # f32[N, S, γ, V]
    verdict = jax.vmap(rule)(
        jax.random.split(k_rule, n_rows),
        p_tab[last],
        p_tab[drafts],
        q,
        drafts,
        jnp.ones((n_rows, s), bool),
    )
    return verdict.n, verdict.tokens


def rule_level_generate(rule, p_tab, q_tabs, n, length, gamma, seed) -> np.ndarray:
    """i32[n, length]: the first `length` tokens committed by `rule`, round after round."""
    out = np.zeros((n, length), np.int32)
    filled = np.zeros(n, np.int64)
    last = jnp.full((n,), START, jnp.int32)
    key = jax.random.key(seed)
    rows = np.arange(n)
    while filled.min() < length:
        key, sub = jax.random.split(key)
        n_acc, toks = _round(
            sub,
            last,
            jnp.asarray(p_tab, jnp.float32),
            jnp.asarray(q_tabs, jnp.float32),
            rule=rule,
            gamma=gamma,
        )
        n_acc, toks = np.asarray(n_acc), np.asarray(toks)
        for j in range(gamma + 1):
            pos = filled + j
            ok = (j <= n_acc) & (pos < length)
            out[rows[ok], pos[ok]] = toks[ok, j]
        filled = np.minimum(filled + n_acc + 1, length)
        last = jnp.asarray(toks[rows, n_acc])
    return out


def _control_tables(seed=11):
    """A verifier and 3 drafters over V = 5 (verifier ids), each τ = 1, as probabilities."""
    rng = np.random.default_rng(seed)
    v_logits = rng.standard_normal((suite.V, suite.V)) * 1.5
    q_logits = rng.standard_normal((3, suite.V, suite.V)) * 1.5
    return v_logits, reference_probs(v_logits, 1.0), reference_probs(q_logits, 1.0)


CONTROLS = {
    # name: (rule, number of chains, lossless?). A tie needs two chains or more; the whole-
    # block discard is furthest from exact with one chain (accepting a whole block is then
    # common, and the accepted block is not distributed as p).
    "shared_block, 3 chains (exact: ties take a fresh sample)": (rules.shared_block, 3, True),
    "token_tree, 3 chains (exact)": (rules.token_tree, 3, True),
    "shared_block, 1 chain = rule 1 (exact)": (rules.shared_block, 1, True),
    "NEGATIVE ties -> primary's residual, 3 chains": (ties_to_residual, 3, False),
    "NEGATIVE whole-block discard, 1 chain": (whole_block_discard, 1, False),
}


@pytest.mark.parametrize("name", list(CONTROLS))
def test_chi2_harness_accepts_exact_rules_and_rejects_lossy_ones(name):
    rule, chains, lossless = CONTROLS[name]
    v_logits, p_tab, q_tabs = _control_tables()
    seqs = rule_level_generate(
        rule, p_tab, q_tabs[:chains], N, LENGTH, gamma=2, seed=zlib.crc32(name.encode())
    )
    exact = reference_law(v_logits, 1.0, START, LENGTH)
    stat, df, p_value, log10p = chi2_test(seqs, exact)
    shown = (
        f"{p_value:.3g}"
        if p_value > 0
        else f"10^{log10p:.0f}"
        if np.isfinite(log10p)
        else "< 1e-300 (underflows)"
    )
    print(f"\n{name}: χ² = {stat:.1f} on {df} df, p = {shown} (N = {N}, α = {ALPHA})")
    if lossless:
        assert p_value >= ALPHA, f"{name}: χ² rejects an exact rule (p = {p_value:.3g})"
    else:
        assert p_value < ALPHA, (
            f"{name}: the harness failed to reject a lossy rule (p = {p_value:.3g})"
        )


# ----------------------------------------------------------------------------------------
# Every verifier temperature, and filtered drafters and verifiers, end to end
# ----------------------------------------------------------------------------------------


def _engine_sequences(
    rule, slots_n, setup, seed, temperature=1.0, verifier_top_k=0, verifier_top_p=1.0, n=N
):
    cfg = EngineConfig(
        gamma=2,
        rule=rule,
        verifier_temperature=temperature,
        n_slots=slots_n,
        max_new_tokens=LENGTH,
        verifier_top_k=verifier_top_k,
        verifier_top_p=verifier_top_p,
    )
    slots = (np.arange(n) % 3)[:, None] if slots_n == 1 else None
    res = speculative_generate(
        cfg,
        setup.verifier,
        setup.v_params,
        setup.drafters,
        setup.d_data,
        [[START]] * n,
        [[p] * n for p in suite.drafter_prompts([START])],
        row_keys_for(seed, n),
        slots=slots,
    )
    assert (res.length - res.start == LENGTH).all()
    return res.tokens[:, 1 : 1 + LENGTH]


@pytest.mark.slow  # 10 engine runs of 100k rows; `make test-all`
@pytest.mark.parametrize("temperature", [0.5, 2.0])
@pytest.mark.parametrize("rule,slots_n", RULES_SLOTS)
def test_lossless_at_verifier_temperature(rule, slots_n, temperature):
    setup = suite.make_setup("random", seed=21)
    seqs = _engine_sequences(
        rule,
        slots_n,
        setup,
        temperature=temperature,
        seed=zlib.crc32(f"{rule}/tau{temperature}".encode()),
    )
    p_value = chi2_pvalue(seqs, reference_law(setup.v_table, temperature, START, LENGTH))
    print(f"\n{rule} verifier τ={temperature}: χ² p = {p_value:.3g}")
    assert p_value >= ALPHA, f"{rule} τ={temperature}: χ² rejects (p = {p_value:.3g})"


FILTERS = {
    # name: (drafter top_k, drafter top_p, verifier top_k, verifier top_p)
    "top-k drafters, top-p verifier": (3, 1.0, 0, 0.8),
    "top-p drafters, top-k verifier": (0, 0.7, 3, 1.0),
}


@pytest.mark.slow  # 10 engine runs of 100k rows; `make test-all`
@pytest.mark.parametrize("filters", list(FILTERS))
@pytest.mark.parametrize("rule,slots_n", RULES_SLOTS)
def test_lossless_with_top_k_and_top_p(rule, slots_n, filters):
    d_k, d_p, v_k, v_p = FILTERS[filters]
    setup = suite.make_setup("random", seed=22)
    setup = dataclasses.replace(
        setup, drafters=tuple(dataclasses.replace(d, top_k=d_k, top_p=d_p) for d in setup.drafters)
    )
    seqs = _engine_sequences(
        rule,
        slots_n,
        setup,
        verifier_top_k=v_k,
        verifier_top_p=v_p,
        seed=zlib.crc32(f"{rule}/{filters}".encode()),
    )
    exact = reference_law(setup.v_table, 1.0, START, LENGTH, top_k=v_k, top_p=v_p)
    p_value = chi2_pvalue(seqs, exact)
    print(f"\n{rule} {filters}: χ² p = {p_value:.3g}")
    assert p_value >= ALPHA, f"{rule} {filters}: χ² rejects (p = {p_value:.3g})"
