"""The lossless verification rules (SPEC §3), for one sequence; lift with `jax.vmap`.

Block layout (one row). The verifier scored `[root] + S slot chains of γ drafts`, so:

    p_root:  f32[V]        target distribution after the root (the last committed token)
    p_nodes: f32[S, γ, V]  target distribution after slot s's draft j (context: root + that
                                                    slot's drafts ≤ j)
    q:       f32[S, γ, V]  the distribution slot s's draft j was sampled from (verifier ids),
                           or the same law on its support (`specjax.verify.qlaw.SparseQ`)
    drafts:  i32[S, γ]     the drafts (verifier ids)
    active:  bool[S]       which slots hold a chain this round (inactive slots are ignored)

Every rule is called as `rule(key, p_root, p_nodes, q, drafts, active, gumbel)` (`key` its
PRNG key; `gumbel` the round's shared Gumbel noise for the coupled rules, None and unused for
the others) and returns a `Verdict`: `n` drafted tokens committed, then one token from the
verifier (residual, fresh or bonus sample), so `1 ≤ n + 1 ≤ γ + 1` tokens per round. Each
is registered as a typed `specjax.verify.rule.Rule` (end of this module); callers ask
`specjax.verify.registry`, never compare names.

Rules:
    * `shared_block` — switch 2 off (the naive design) and, with one active slot, plain
        `rejection` (Leviathan et al. 2023): every chain tested alone with min(1, p/q_k); the
        block is cut at the first position where *any* chain was rejected; the primary chain
        (first active slot) is committed up to the cut; the token at the cut is the primary's
        residual only if its own rejection came strictly first, otherwise a fresh sample of p.
    * `token_tree` — switch 2 on: recursive rejection sampling over the slot chains
        (SpecInfer, Miao et al. 2024, Thm 4.2); each chain truncated at its own first rejection,
        each rejection attributed to its slot.
    * `coupled` — drafter-invariant Gumbel coupling (Daliri, Musco, Suresh 2025): drafts and
        the verifier's tokens are Gumbel-max samples with the same noise; the output is the
        verifier's Gumbel-max sample whatever the drafts. Each chain is cut at its own first
        mismatch and the longest chain is committed (switch 2 on).
    * `coupled_block` — the same coupling with the naive shared block (switch 2 off): the
        block is cut at the first position where *any* active chain mismatched, for every
        drafter. Still exact (every committed token is the verifier's Gumbel-max sample).
    * `block_verification` — one chain verified as a block (Sun et al., ICLR 2025): the
        chain is kept up to the *last* position that passes a test weighing the whole
        prefix, not cut at the first token-level rejection. Optimal in expected tokens per
        round among valid verifications of one draft chain, so never below `rejection`;
        the same at verifier τ 0.
    * `traversal` — its own module, `specjax.verify.traversal` (Weng et al. 2025).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from flax import struct

from specjax.runtime import debug
from specjax.verify.distributions import accept_test, gumbel_argmax, residual
from specjax.verify.qlaw import check_q, q_at, q_dense, residual_update, scaled_residual
from specjax.verify.rule import Rule, register
from specjax.verify.streams import key_data, sample_rows_u, split_data, uniform_data


@struct.dataclass
class Verdict:
    """What one round of verification decided for one row.

    Attributes:
        n: i32[] drafted tokens committed (0..γ).
        tokens: i32[γ+1] committed tokens: `tokens[:n]` drafts, `tokens[n]` the verifier's;
            entries past `n` are 0.
        path_slot: i32[γ] the slot whose tree node holds path depth j (valid for j < n); used
            to compact the verifier's KV cache onto the committed path.
        accepted: i32[S] drafts of each slot accepted by this round's verification.
        rejected: i32[S] rejections attributed to each slot (rejection attribution).
        matched: i32[S] leading drafts of each slot equal to the committed drafts (≤ n): the
            part of a drafter's own cache that stays valid.
        own_first_rejection: i32[S] where each chain, tested alone against p with its own
            uniforms, was first rejected (γ if never): per-drafter and independent-branch
            acceptance, measured without an extra verifier call.
        reached: i32[] block positions that verification reached, min(n + 1, γ).
        cut_at: i32[S] the block depth (0..γ−1) at which each chain's drafts were cut by a
            rejection — its own, or in the naive shared block the block's cut — so the
            chain discards `γ − cut_at` draft tokens, the rejected one included; γ when the
            chain was not cut (SPEC §7 mean truncation depth).
        pruned_at: i32[S] token tree only: the depth at which a chain left the committed
            path because a sibling's different token was accepted there (it was never
            rejected); γ otherwise. Counted apart from truncations (`pruned_depth`).
        match_lead: i32[S] coupled rules: leading drafts equal to the verifier's Gumbel-max
            tokens (the coupled match, ≤ Σ min(p, q) per position); other rules: the same
            as `own_first_rejection`.
        kept_expected / kept_rule1: f32[] one-chain rules (`rejection`,
            `block_verification`): the expected drafts kept given this round's block (its
            drafts, p and q) under this rule and under rule 1 — the two rules on the same
            blocks, without the noise of the accept draws; 0 under the other rules. On one
            block either may be larger: block verification's optimality is an average over
            the drafts' law.
    """

    n: jax.Array
    tokens: jax.Array
    path_slot: jax.Array
    accepted: jax.Array
    rejected: jax.Array
    matched: jax.Array
    own_first_rejection: jax.Array
    reached: jax.Array
    cut_at: jax.Array
    pruned_at: jax.Array
    match_lead: jax.Array
    kept_expected: jax.Array
    kept_rule1: jax.Array


def _p_before(p_root, p_nodes):
    """f32[S, γ, V]: the target distribution each draft was tested against."""
    s = p_nodes.shape[0]
    root = jnp.broadcast_to(p_root, (s, 1) + p_root.shape)
    return jnp.concatenate([root, p_nodes[:, :-1]], axis=1)


def _gather_tok(dist, tok):
    """dist f32[..., V], tok i32[...] → f32[...]."""
    return jnp.take_along_axis(dist, tok[..., None], axis=-1)[..., 0]


def _leading(flags):
    """Number of leading True values along the last axis."""
    return jnp.sum(jnp.cumprod(flags.astype(jnp.int32), axis=-1), axis=-1)


def _accept_probs(p_x, q_x):
    """min(1, p(x)/q(x)) per draft, as `accept_test` decides it (q(x) = 0: p(x) > 0)."""
    safe = jnp.where(q_x > 0, q_x, 1.0)
    return jnp.where(q_x > 0, jnp.minimum(1.0, p_x / safe), (p_x > 0).astype(jnp.float32))


def _chain_length(q_x, active):
    """i32[]: one chain's drafts that q could propose, leading (a drafter of γ_k < γ pads its
    q rows with zeros; a draft drawn from q has q(x) > 0); 0 when the slot is inactive."""
    return jnp.where(active[0], _leading(q_x > 0), 0)


def _rule1_expected(p_x, q_x, g):
    """f32[]: rule 1's expected drafts kept on a chain of length g, Σ_t Π_{i≤t} a_i."""
    alive = jnp.cumprod(_accept_probs(p_x, q_x))
    return jnp.sum(jnp.where(jnp.arange(p_x.shape[0]) < g, alive, 0.0))


def _matched(drafts, path, n):
    gamma = drafts.shape[-1]
    eq = (drafts == path[None, :gamma]) & (jnp.arange(gamma) < n)[None, :]
    return _leading(eq)


def _p_at(p_root, p_nodes, drafts):
    """f32[S, γ]: each draft's target probability where it was tested (`_p_before` at the
    drafts, without building the [S, γ, V] block)."""
    at_root = p_root[drafts[:, :1]]
    deeper = _gather_tok(p_nodes[:, :-1], drafts[:, 1:])
    return jnp.concatenate([at_root, deeper], axis=1)


def _own_tests(u, p_x, q, drafts, active):
    """Each chain tested alone: i32[S] first rejection (γ when never; γ when inactive).
    `p_x` f32[S, γ]: the target's probability of each draft (`_p_at`)."""
    acc = accept_test(u, p_x, q_at(q, drafts))
    first = _leading(acc)
    return jnp.where(active, first, drafts.shape[-1])


def _check(p_root, p_nodes, q, drafts, active):
    s, gamma, v = q.shape
    chex.assert_shape(p_root, (v,))
    chex.assert_shape(p_nodes, (s, gamma, v))
    chex.assert_shape(drafts, (s, gamma))
    chex.assert_shape(active, (s,))
    # Value checks (SPEC §9), traced only when `specjax.runtime.debug` is enabled (the tests).
    debug.check_distribution(p_root, 'verify: p_root')
    debug.check_distribution(p_nodes, 'verify: p_nodes')
    # q rows of a chain shorter than γ are zero padding (the engine cuts them).
    check_q(q, 'verify: q')
    debug.check(jnp.all((drafts >= 0) & (drafts < v)), 'verify: a draft outside [0, V)')


def shared_block(key, p_root, p_nodes, q, drafts, active, gumbel=None) -> Verdict:
    """Switch 2 off: one shared block, the verifier a min over drafters (SPEC §4).

    With a single active slot this is exactly Leviathan/Chen rejection sampling.
    Lossless: other chains' outcomes are independent of the primary chain, so the cut is a
    stopping time for it, and a fresh sample of p after a stopping time is exact. A tie at
    the cut takes the fresh sample (the residual there would bias the output).
    """
    _check(p_root, p_nodes, q, drafts, active)
    s, gamma, _ = q.shape
    # jax.random.split / uniform, bit for bit (specjax.verify.streams); the token at the
    # cut by inverse CDF on one uniform (`streams.sample_rows_u`).
    k_u, k_tok = split_data(key_data(key), 2)
    p_x = _p_at(p_root, p_nodes, drafts)
    first = _own_tests(uniform_data(k_u, (s, gamma)), p_x, q, drafts, active)
    primary = jnp.argmax(active)
    cut = jnp.min(first)
    others_later = jnp.all(jnp.where(jnp.arange(s) == primary, True, first > cut))
    own_first = first[primary] == cut
    cut_c = jnp.minimum(cut, gamma - 1)
    p_cut = jnp.where(cut_c == 0, p_root, p_nodes[primary, jnp.maximum(cut_c - 1, 0)])
    dist = jnp.where(
        cut == gamma,
        p_nodes[primary, gamma - 1],
        jnp.where(own_first & others_later, residual(p_cut, q_dense(q[primary, cut_c])), p_cut),
    )
    final = sample_rows_u(uniform_data(k_tok), dist)
    idx = jnp.arange(gamma + 1)
    tokens = jnp.where(idx < cut, jnp.pad(drafts[primary], (0, 1)), 0)
    tokens = jnp.where(idx == cut, final, tokens)
    rejected = (active & (first == cut) & (cut < gamma)).astype(jnp.int32)
    first = first.astype(jnp.int32)
    if s == 1:  # rule 1: its expected drafts kept on this block
        q_x = q_at(q, drafts)[0]
        kept = _rule1_expected(p_x[0], q_x, _chain_length(q_x, active))
    else:
        kept = jnp.float32(0.0)
    return Verdict(
        n=cut.astype(jnp.int32),
        tokens=tokens.astype(jnp.int32),
        path_slot=jnp.full((gamma,), primary, jnp.int32),
        accepted=jnp.where(active, jnp.minimum(first, cut), 0).astype(jnp.int32),
        rejected=rejected,
        matched=jnp.where(active, _matched(drafts, tokens, cut), 0),
        own_first_rejection=first,
        reached=jnp.minimum(cut + 1, gamma).astype(jnp.int32),
        cut_at=_block_cut(active, cut, gamma),
        pruned_at=jnp.full((s,), gamma, jnp.int32),
        match_lead=first,
        kept_expected=kept,
        kept_rule1=kept,
    )


def _block_cut(active, cut, gamma):
    """Every active chain cut at the block's cut (the naive design), γ when none."""
    return jnp.where(active & (cut < gamma), cut, gamma).astype(jnp.int32)


def rejection(key, p_root, p_nodes, q, drafts, active, gumbel=None) -> Verdict:
    """Rule 1 (Leviathan et al. 2023; Chen et al. 2023) for a single chain (S = 1)."""
    if q.shape[0] != 1:
        raise ValueError(
            f"rule 'rejection' verifies one chain per row; got {q.shape[0]} slots "
            "(use 'token_tree' or 'shared_block' for several drafters)"
        )
    return shared_block(key, p_root, p_nodes, q, drafts, active)


def block_verification(key, p_root, p_nodes, q, drafts, active, gumbel=None) -> Verdict:
    """Block verification of one chain (S = 1; Sun, Mendlovic, Leviathan et al., ICLR 2025).

    With the drafts x_1..x_g of a chain of length g ≤ γ (q rows past g are zero padding),
    p_i the target and q_i the draft law after i drafts, the prefix weights are
    w_0 = 1, w_i = min(1, w_{i−1} p_{i−1}(x_i) / q_{i−1}(x_i)), and stopping after i drafts
    has the residual r_i = max(0, w_i p_i − q_i) of mass R_i. Position i passes its test
    with probability h_i = R_i / (R_i + 1 − w_i) for i < g and h_g = w_g; the chain is kept
    up to the last position τ that passes (0 if none), and the next token is drawn from
    p_g if τ = g, else from r_τ. Every output prefix has the target's law (the paper's
    Thm 2; `tests/test_block_verification.py` checks it exactly on small vocabularies and
    by χ² end to end), and the expected accepted length is the largest any valid
    verification of the chain can reach — at least `rejection`'s. With a one-hot p (τ 0)
    the weights are 1 up to the first mismatch and 0 after, so it commits the greedy tokens
    as `rejection` does. Cost: γ − 1 reductions over V (the residuals' masses) and one
    residual, beside rule 1's one residual: the same time per round on the Xeon.
    """
    if q.shape[0] != 1:
        raise ValueError(
            f"rule 'block_verification' verifies one chain per row; got {q.shape[0]} slots"
        )
    _check(p_root, p_nodes, q, drafts, active)
    _, gamma, _ = q.shape
    k_u, k_own, k_tok = split_data(key_data(key), 3)
    eta = uniform_data(k_u, (gamma,))
    p_x = _p_at(p_root, p_nodes, drafts)  # f32[1, γ]
    q_x = q_at(q, drafts)[0]
    g = _chain_length(q_x, active)
    # Static loop over positions (γ is small): weights and pass probabilities; each
    # residual's mass is one fused reduction over V (the vector itself is not kept).
    w = jnp.float32(1.0)
    weights, h = [w], []
    for i in range(gamma):
        if i > 0:  # h_i for i < g; position i's test is eta[i - 1]
            _, mass_i = scaled_residual(p_nodes[0, i - 1], w, q[0, i])
            den = mass_i + (1.0 - w)
            h.append(jnp.where((i < g) & (den > 0), mass_i / jnp.where(den > 0, den, 1.0), 0.0))
        # w_{i+1} = min(1, w_i p_i(x) / q_i(x)), with q(x) = 0 read as `accept_test` does.
        w = _accept_probs(w * p_x[0, i], q_x[i])
        weights.append(w)
    h.append(jnp.float32(0.0))  # position γ; h_g is set below
    idx = jnp.arange(1, gamma + 1)
    weights = jnp.stack(weights)
    h = jnp.where(idx == g, weights[g], jnp.stack(h))
    passed = eta < h  # bool[γ], position i at i − 1
    tau = jnp.max(jnp.where(passed, idx, 0)).astype(jnp.int32)
    # The next token: p after g drafts at τ = g, else the residual r_τ (unnormalised; a
    # residual without mass is reachable only with probability 0: p_τ keeps it finite).
    p_tau = jnp.where(tau == 0, p_root, p_nodes[0, jnp.maximum(tau - 1, 0)])
    r, mass = scaled_residual(p_tau, weights[tau], q[0, jnp.minimum(tau, gamma - 1)])
    dist = jnp.where((tau < g) & (mass > 0), r, p_tau)
    final = sample_rows_u(uniform_data(k_tok), dist)
    pos = jnp.arange(gamma + 1)
    tokens = jnp.where(pos < tau, jnp.pad(drafts[0], (0, 1)), 0)
    tokens = jnp.where(pos == tau, final, tokens).astype(jnp.int32)
    first = _own_tests(uniform_data(k_own, (1, gamma)), p_x, q, drafts, active).astype(jnp.int32)
    stopped = active & (tau < g)
    # E[τ] = Σ_t P(τ ≥ t) with P(τ ≥ t) = 1 − Π_{j ≥ t} (1 − h_j).
    none_from = jnp.cumprod((1.0 - h)[::-1])[::-1]
    kept = jnp.sum(1.0 - none_from)
    return Verdict(
        n=tau,
        tokens=tokens,
        path_slot=jnp.zeros((gamma,), jnp.int32),
        accepted=jnp.where(active, tau, 0).astype(jnp.int32),
        rejected=stopped.astype(jnp.int32),
        matched=jnp.where(active, _matched(drafts, tokens, tau), 0),
        own_first_rejection=first,
        reached=jnp.minimum(tau + 1, gamma).astype(jnp.int32),
        cut_at=jnp.where(stopped, tau, gamma).astype(jnp.int32),
        pruned_at=jnp.full((1,), gamma, jnp.int32),
        match_lead=first,
        kept_expected=kept,
        kept_rule1=_rule1_expected(p_x[0], q_x, g),
    )


def token_tree(key, p_root, p_nodes, q, drafts, active, gumbel=None) -> Verdict:
    """Rule 2: recursive rejection sampling over the slot chains (SpecInfer Thm 4.2).

    At a node the children (the depth-d drafts of the chains still on the committed path,
    in slot order) are tried in turn: child k is accepted with min(1, r_k(x_k)/q_k(x_k)),
    r_1 = p, r_{k+1} = norm(max(0, r_k − q_k)); if all are rejected the token is sampled
    from the last residual. A chain stays on the path while its drafts equal the committed
    ones (its next draft is then a fresh sample from q_k given the path, as the theorem
    needs), so chains that agree keep proposing.
    """
    _check(p_root, p_nodes, q, drafts, active)
    s, gamma, _ = q.shape
    # jax.random.split / uniform, bit for bit (specjax.verify.streams). Depth d's sample
    # is drawn by inverse CDF with the uniform of key split(k_tok, γ+1)[d]; a row samples
    # at one depth only (where every child was rejected, or the bonus at γ), so that
    # distribution is carried out of the loop and sampled once.
    k_u, k_own, k_tok = split_data(key_data(key), 3)
    u = uniform_data(k_u, (gamma, s))

    done, n = jnp.array(False), jnp.int32(0)
    cur = jnp.argmax(active).astype(jnp.int32)
    alive = active
    tokens = jnp.zeros((gamma + 1,), jnp.int32)
    path_slot = jnp.zeros((gamma,), jnp.int32)
    acc = rej = jnp.zeros((s,), jnp.int32)
    cut_at = pruned_at = jnp.full((s,), gamma, jnp.int32)
    r_stop = jnp.zeros_like(p_root)
    # Both loops unrolled at trace time (S and γ are small and static, so every index into
    # q, the drafts and the uniforms is a static slice): a rolled loop costs XLA:CPU copies
    # of its state and a few thunks per trip, every round.
    for d in range(gamma):
        rej_before = rej
        # The residual is kept unnormalised, (r, z) for the law r / z (`residual_update`):
        # a rejection then touches only q's support when q is a `SparseQ`.
        r = p_root if d == 0 else p_nodes[cur, d - 1]
        r, found, slot, rej = _node_trials(u, r, q, drafts, d, alive, done, rej)
        x = drafts[slot, d]
        stop_here = ~done & ~found
        r_stop = jnp.where(stop_here, r, r_stop)  # the last residual: sampled below
        tokens = tokens.at[d].set(jnp.where(done | ~found, tokens[d], x))
        path_slot = path_slot.at[d].set(jnp.where(found & ~done, slot, path_slot[d]))
        acc = acc.at[slot].add((found & ~done).astype(jnp.int32))
        new_alive = jnp.where(found & ~done, alive & (drafts[:, d] == x), alive)
        # Chains leaving the path here: cut by their own rejection at this node, or (never
        # tried, or their token equals none accepted) pruned by a sibling's accepted token.
        left = alive & ~done & (~new_alive | stop_here)
        cut_at, pruned_at = _left_at(left, rej > rej_before, d, cut_at, pruned_at)
        alive = new_alive
        n = n + (found & ~done).astype(jnp.int32)
        cur = jnp.where(found & ~done, slot, cur)
        done = done | stop_here
    # The one sample: at depth n from the last residual if the row stopped there (done),
    # else the bonus at depth γ from p after the last accepted draft.
    # (r_stop is unnormalised: the inverse CDF scales its uniform by the weights' sum.)
    dist = jnp.where(done, r_stop, p_nodes[cur, gamma - 1])
    tokens = tokens.at[n].set(sample_rows_u(uniform_data(split_data(k_tok, gamma + 1)[n]), dist))
    p_x = _p_at(p_root, p_nodes, drafts)
    first = _own_tests(uniform_data(k_own, (s, gamma)), p_x, q, drafts, active).astype(jnp.int32)
    return Verdict(
        n=n,
        tokens=tokens,
        path_slot=path_slot,
        accepted=acc,
        rejected=rej,
        matched=jnp.where(active, _matched(drafts, tokens, n), 0),
        own_first_rejection=first,
        reached=jnp.minimum(n + 1, gamma).astype(jnp.int32),
        cut_at=jnp.where(active, cut_at, gamma),
        pruned_at=jnp.where(active, pruned_at, gamma),
        match_lead=first,
        kept_expected=jnp.float32(0.0),
        kept_rule1=jnp.float32(0.0),
    )


def _node_trials(u, r, q, drafts, d: int, alive, done, rej) -> tuple:
    """The children at depth ``d`` tried in slot order (`token_tree`; ``u``: its uniforms
    [γ, S]): child k, on the path and tried while none was accepted, is accepted with
    min(1, r_k(x_k)/q_k(x_k)), else the residual moves on. Returns the last residual
    (unnormalised), whether one was accepted, its slot, and the rejections per chain with
    this node's added."""
    z = jnp.float32(1.0)
    found, slot = jnp.array(False), jnp.int32(0)
    for k in range(q.shape[0]):
        x = drafts[k, d]
        try_k = alive[k] & ~found & ~done
        ok = accept_test(u[d, k], r[x], z * q_at(q[k, d], x))
        hit = try_k & ok
        miss = try_k & ~ok
        r, z = residual_update(r, z, q[k, d], miss)
        rej = rej.at[k].add(miss.astype(jnp.int32))
        found, slot = found | hit, jnp.where(hit, k, slot)
    return r, found, slot, rej


def _left_at(left, was_rejected, d: int, cut_at, pruned_at) -> tuple:
    """Chains ``left`` leaving the path at depth ``d``: cut by their own rejection there,
    else pruned (never tried, or their token equals none accepted)."""
    cut_at = jnp.where(left & was_rejected, d, cut_at)
    pruned_at = jnp.where(left & ~was_rejected, d, pruned_at)
    return cut_at, pruned_at


def coupled(key, p_root, p_nodes, q, drafts, active, gumbel) -> Verdict:
    """Rule 4: drafter-invariant verification with shared Gumbel noise (longest chain).

    Args:
        key: PRNG key of the per-drafter measurement: each chain is also tested alone with
            Leviathan's rule (fresh uniforms, min(1, p/q)), which is what `own_first_rejection`
            reports, so per-drafter α means the same under every rule (SPEC §7). It decides
            nothing. None: `own_first_rejection` is the Gumbel match (`match_lead`).
        gumbel: f32[γ+1, V] the noise of absolute positions length..length+γ; the drafts must
            be `argmax(log q + g)` with the same noise. The committed tokens are
            `argmax(log p + g)` along the path, i.e. the verifier's own sample for this noise.
    """
    return _coupled(gumbel, p_root, p_nodes, q, drafts, active, key, shared_block=False)


def coupled_block(key, p_root, p_nodes, q, drafts, active, gumbel) -> Verdict:
    """Rule 4 with switch 2 off: the block is cut where the first active chain mismatched."""
    return _coupled(gumbel, p_root, p_nodes, q, drafts, active, key, shared_block=True)


def _coupled(gumbel, p_root, p_nodes, q, drafts, active, key, shared_block: bool) -> Verdict:
    _check(p_root, p_nodes, q, drafts, active)
    s, gamma, _ = q.shape
    p_before = _p_before(p_root, p_nodes)
    target = gumbel_argmax(p_before, gumbel[None, :gamma])  # i32[S, γ]
    lead = jnp.where(active, _leading(drafts == target), -1)
    if shared_block:
        # The primary chain, cut at the earliest mismatch of any active chain.
        best = jnp.argmax(active)
        n = jnp.min(jnp.where(active, lead, gamma)).astype(jnp.int32)
    else:
        best = jnp.argmax(lead)
        n = jnp.maximum(lead[best], 0).astype(jnp.int32)
    final = jnp.where(
        n < gamma,
        target[best, jnp.minimum(n, gamma - 1)],
        gumbel_argmax(p_nodes[best, gamma - 1], gumbel[gamma]),
    )
    idx = jnp.arange(gamma + 1)
    tokens = jnp.where(idx < n, jnp.pad(drafts[best], (0, 1)), 0)
    tokens = jnp.where(idx == n, final, tokens).astype(jnp.int32)
    lead0 = jnp.maximum(lead, 0)
    match = jnp.where(active, lead0, gamma).astype(jnp.int32)
    if key is None:
        own = match
    else:
        own = _own_tests(
            uniform_data(key_data(key), (s, gamma)),
            _p_at(p_root, p_nodes, drafts),
            q,
            drafts,
            active,
        ).astype(jnp.int32)
    if shared_block:
        cut_at = _block_cut(active, n, gamma)
    else:  # each chain cut at its own mismatch
        cut_at = jnp.where(active & (lead0 < gamma), lead0, gamma).astype(jnp.int32)
    return Verdict(
        n=n,
        tokens=tokens,
        path_slot=jnp.full((gamma,), best, jnp.int32),
        accepted=jnp.minimum(lead0, n).astype(jnp.int32),
        rejected=(active & (lead0 < gamma) & (lead0 <= n)).astype(jnp.int32),
        matched=jnp.where(active, _matched(drafts, tokens, n), 0),
        own_first_rejection=own,
        reached=jnp.minimum(n + 1, gamma).astype(jnp.int32),
        cut_at=cut_at,
        pruned_at=jnp.full((s,), gamma, jnp.int32),
        match_lead=match,
        kept_expected=jnp.float32(0.0),
        kept_rule1=jnp.float32(0.0),
    )


# ----------------------------------------------------------------------------------------
# The rules of this module, registered (`specjax.verify.registry` imports this module).
# ----------------------------------------------------------------------------------------

REJECTION = register(
    Rule(
        'rejection',
        rejection,
        chains=1,
        rule1=True,
        summary='rule 1: Leviathan et al. 2023, one chain',
    )
)
TOKEN_TREE = register(
    Rule(
        'token_tree',
        token_tree,
        naive='shared_block',
        lone='rejection',
        twins_without_replacement=True,
        summary='rule 2: recursive rejection sampling over the chains (SpecInfer)',
    )
)
SHARED_BLOCK = register(
    Rule(
        'shared_block',
        shared_block,
        lone='rejection',
        summary='switch 2 off: one shared block cut at the first rejection of any chain',
    )
)
COUPLED = register(
    Rule(
        'coupled',
        coupled,
        coupled=True,
        naive='coupled_block',
        plan=True,
        summary='drafter-invariant Gumbel coupling, longest chain (Daliri et al. 2025)',
    )
)
COUPLED_BLOCK = register(
    Rule(
        'coupled_block',
        coupled_block,
        coupled=True,
        lone='coupled',
        summary='the Gumbel coupling with the naive shared block',
    )
)
BLOCK_VERIFICATION = register(
    Rule(
        'block_verification',
        block_verification,
        chains=1,
        tree='token_tree',
        plan=True,
        summary='one chain verified as a block (Sun et al., ICLR 2025)',
    )
)
