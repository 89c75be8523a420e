"""Traversal verification over the slot chains (Weng et al., NeurIPS 2025, arXiv 2505.12398).

The verifier scored a token tree: the root (the last committed token) and S chains hanging
from it, one per active slot (`specjax.verify.rules` gives the shapes). Token-level rules
walk it top-down and drop a node's whole subtree at its first rejection (`token_tree`).
Traversal verification walks it leaf to root, in depth-first post-order, and accepts a
node by the probability of the whole sequence from the root to it, so a rejected draft
does not take its accepted prefix with it:

  * chain k (slots in order, inactive slots skipped) is verified as a block against the
    root's current law r_k (r_1 = p after the root): with its drafts x_1..x_g and q_i the
    law draft i + 1 was drawn from, the weights are w_0 = 1,
    w_1 = min(1, r_k(x_1) / q_0(x_1)), w_{i+1} = min(1, w_i p_i(x_{i+1}) / q_i(x_{i+1}));
    the leaf is accepted with h_g = w_g and, once its child was rejected, node i < g with
    h_i = R_i / (R_i + 1 − w_i), R_i the mass of max(0, w_i p_i − q_i) — the first node
    (deepest first) that passes ends the round: its path is committed and the next token
    drawn from p_g (the leaf) or from norm(max(0, w_i p_i − q_i));
  * if no node of chain k passes, its head is rejected at the root, whose law becomes
    r_{k+1} = norm(max(0, r_k − q_0)) (recursive rejection sampling), and the traversal
    moves to chain k + 1; when every chain was rejected the token is drawn from the last r.

On one chain this is block verification (Sun et al., ICLR 2025; the paper's Thm: optimal
among valid verifications of one chain, `rules.block_verification` bit for bit). The tree's
nodes are the block's positions (chains are not merged where their tokens agree).

Why it is lossless: block verification is exact for any target sequence law and any draft
law (`q` says which), here the target (r_k, then p). Run alone on chain k, it draws the
next token from norm(max(0, r_k − q_0)) when no node passes, then p continues; so given
chain k's failure and its drafts the output must follow (r_{k+1}, then p), and the traversal
of the next chains is block verification against exactly that law, with drafts whose law
`q` gives (independent of chain k's uniforms; twins' heads drawn without replacement of the
heads tried before them are drawn from the law `q` states). `tests/test_traversal.py`
checks the law exactly on small trees by enumeration and end to end by χ²; at verifier τ 0
it commits the greedy tokens (a one-hot p leaves a one-hot residual at the root).

Cost: S·(γ − 1) reductions over V (each chain's residual masses), S residual updates at the
root and one residual at the end, beside `token_tree`'s S·γ accept tests and updates.
"""

from __future__ import annotations

import jax.numpy as jnp

from specjax.verify.qlaw import q_at, residual_update, scaled_residual
from specjax.verify.rule import Rule, register
from specjax.verify.rules import (
    Verdict,
    _accept_probs,
    _chain_length,
    _check,
    _matched,
    _own_tests,
    _p_at,
)
from specjax.verify.streams import key_data, sample_rows_u, split_data, uniform_data


def traversal(key, p_root, p_nodes, q, drafts, active, gumbel=None) -> Verdict:
    """Traversal verification of one row (the module docstring); `gumbel` is unused."""
    del gumbel
    _check(p_root, p_nodes, q, drafts, active)
    s, gamma, _ = q.shape
    # The same streams as `block_verification` (one chain: the same verdict, bit for bit).
    k_u, k_own, k_tok = split_data(key_data(key), 3)
    eta = uniform_data(k_u, (s, gamma))
    p_x = _p_at(p_root, p_nodes, drafts)  # f32[S, γ]
    q_x = q_at(q, drafts)  # f32[S, γ]
    idx = jnp.arange(1, gamma + 1)

    # The root's law, unnormalised (r, z) as in `token_tree` (`residual_update`).
    r, z = p_root, jnp.float32(1.0)
    done = jnp.array(False)
    n = jnp.int32(0)
    win = jnp.argmax(active).astype(jnp.int32)
    w_win = jnp.float32(1.0)
    g_win = jnp.int32(0)
    tried = jnp.zeros((s,), bool)
    failed = jnp.zeros((s,), bool)
    # Unrolled at trace time (S and γ are small and static), as `token_tree`.
    for k in range(s):
        g = _chain_length(q_x[k], active[k : k + 1])  # 0 for an inactive slot
        w = _accept_probs(r[drafts[k, 0]] / z, q_x[k, 0])  # w_1 against the root's law
        weights, h = [jnp.float32(1.0), w], []
        for i in range(1, gamma):
            _, mass_i = scaled_residual(p_nodes[k, i - 1], w, q[k, i])
            den = mass_i + (1.0 - w)
            h.append(jnp.where((i < g) & (den > 0), mass_i / jnp.where(den > 0, den, 1.0), 0.0))
            w = _accept_probs(w * p_x[k, i], q_x[k, i])
            weights.append(w)
        h.append(jnp.float32(0.0))  # position γ; h_g is set below
        weights = jnp.stack(weights)
        h = jnp.where(idx == g, weights[g], jnp.stack(h))
        tau = jnp.max(jnp.where(eta[k] < h, idx, 0)).astype(jnp.int32)
        try_k = active[k] & ~done
        win_k = try_k & (tau > 0)
        fail_k = try_k & (tau == 0)
        r, z = residual_update(r, z, q[k, 0], fail_k)  # the head rejected at the root
        n = jnp.where(win_k, tau, n)
        win = jnp.where(win_k, k, win)
        w_win = jnp.where(win_k, weights[tau], w_win)
        g_win = jnp.where(win_k, g, g_win)
        tried = tried.at[k].set(try_k)
        failed = failed.at[k].set(fail_k)
        done = done | win_k

    # The next token: after the accepted node, p (a leaf) or its residual; when every chain
    # was rejected, the root's last law. Unnormalised weights: `sample_rows_u` scales.
    p_n = jnp.where(n == 0, p_root, p_nodes[win, jnp.maximum(n - 1, 0)])
    r_n, mass = scaled_residual(p_n, w_win, q[win, jnp.minimum(n, gamma - 1)])
    dist = jnp.where(done, jnp.where((n < g_win) & (mass > 0), r_n, p_n), r)
    final = sample_rows_u(uniform_data(k_tok), dist)
    pos = jnp.arange(gamma + 1)
    tokens = jnp.where(pos < n, jnp.pad(drafts[win], (0, 1)), 0)
    tokens = jnp.where(pos == n, final, tokens).astype(jnp.int32)

    slot = jnp.arange(s)
    is_win = done & (slot == win)
    stopped = is_win & (n < g_win)  # the winner's chain cut below its leaf
    matched = jnp.where(active, _matched(drafts, tokens, n), 0)
    untried = active & ~tried  # a sibling's path was accepted first
    first = _own_tests(uniform_data(k_own, (s, gamma)), p_x, q, drafts, active).astype(jnp.int32)
    return Verdict(
        n=n,
        tokens=tokens,
        path_slot=jnp.full((gamma,), win, jnp.int32),
        accepted=jnp.where(is_win, n, 0).astype(jnp.int32),
        rejected=(failed | stopped).astype(jnp.int32),
        matched=matched,
        own_first_rejection=first,
        reached=jnp.minimum(n + 1, gamma).astype(jnp.int32),
        cut_at=jnp.where(failed, 0, jnp.where(stopped, n, gamma)).astype(jnp.int32),
        pruned_at=jnp.where(untried & (matched < gamma), matched, gamma).astype(jnp.int32),
        match_lead=first,
        kept_expected=jnp.float32(0.0),
        kept_rule1=jnp.float32(0.0),
    )


TRAVERSAL = register(
    Rule(
        name='traversal',
        verify=traversal,
        naive='shared_block',
        lone='block_verification',
        twins_without_replacement=True,
        plan=True,
        summary='traversal verification: each chain as a block, leaf to root, RRS at the root',
    )
)
