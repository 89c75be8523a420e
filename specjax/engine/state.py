"""The engine's state: the loop state of a speculative call (`DecodeState`), what a later
call continues from (`EngineState`: caches carried across plan steps and continuous-batching
refills) and the per-row, per-drafter counters every round updates (`Counters`).
`specjax.engine.decode` runs the rounds over them."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from specjax.models.cache import half_set

__all__ = ["Counters", "DecodeState", "EngineState", "count_round"]


@struct.dataclass
class Counters:
    """Per-row counters of SPEC §7, accumulated inside the graph (K = drafters).

    Attributes:
      rounds: i32[B] verifier calls (rounds) while the row was live.
      committed: i32[B] tokens committed.
      from_draft: i32[B] committed tokens that were drafts.
      reached: i32[B] shared-block positions verification reached.
      multi_rounds / multi_from_draft / multi_reached: the same over rounds in which ≥ 2
        drafters extended the row's committed prefix (joint acceptance).
      truncations: i32[B] chains cut at a rejection (their own, or in the naive shared block
        the block's cut), summed over the row's chains and rounds.
      discarded: i32[B] draft tokens those cuts discarded, the rejected one included
        (mean truncation depth = discarded / truncations, SPEC §7).
      pruned / pruned_discarded: i32[B] token-tree chains that left the path because a
        sibling's token was accepted, and the draft tokens they dropped (`pruned_depth`).
      proposed: i32[B, K] drafts proposed by each drafter (γ per round it took part in).
      accepted / rejected: i32[B, K] drafts accepted / rejections, attributed per drafter.
      own_accepted_at / own_reached_at: i32[B, K, γ] each drafter's chain tested alone
        against p with Leviathan's rule, per position (per-drafter α and independent-branch
        acceptance), under every rule.
      match_at / match_reached_at: i32[B, K, γ] coupled rules: each drafter's chain against
        the verifier's Gumbel-max tokens (`coupled_match_rate`); zero under other rules.
      catchups: i32[B, K] forwards each drafter ran for the row before the first round of
        a call that continues a state, to consume committed tokens it had not seen (a
        fallback step, a step it sat out): the catch-up passes the cost model charges.
      kept_expected / kept_rule1: f32[B] one-chain rules: the sum over the row's rounds of
        the drafts the round's block was expected to keep under the call's rule and under
        rule 1 (`rules.Verdict`); their difference is the rule's gain over rule 1 on the
        same blocks. 0 under multi-chain rules.
    """

    rounds: jax.Array
    committed: jax.Array
    from_draft: jax.Array
    reached: jax.Array
    multi_rounds: jax.Array
    multi_from_draft: jax.Array
    multi_reached: jax.Array
    truncations: jax.Array
    discarded: jax.Array
    proposed: jax.Array
    accepted: jax.Array
    rejected: jax.Array
    own_accepted_at: jax.Array
    own_reached_at: jax.Array
    pruned: jax.Array
    pruned_discarded: jax.Array
    match_at: jax.Array
    match_reached_at: jax.Array
    catchups: jax.Array
    kept_expected: jax.Array
    kept_rule1: jax.Array

    @classmethod
    def zeros(cls, batch: int, n_drafters: int, gamma: int) -> "Counters":
        z = lambda *s: jnp.zeros(s, jnp.int32)
        return cls(
            z(batch),
            z(batch),
            z(batch),
            z(batch),
            z(batch),
            z(batch),
            z(batch),
            z(batch),
            z(batch),
            z(batch, n_drafters),
            z(batch, n_drafters),
            z(batch, n_drafters),
            z(batch, n_drafters, gamma),
            z(batch, n_drafters, gamma),
            z(batch),
            z(batch),
            z(batch, n_drafters, gamma),
            z(batch, n_drafters, gamma),
            z(batch, n_drafters),
            jnp.zeros((batch,), jnp.float32),
            jnp.zeros((batch,), jnp.float32),
        )


@struct.dataclass
class DecodeState:
    """The loop state of `generate` (B rows, K drafters, buffer length L).

    Attributes:
      tokens: i32[B, L] prompt then committed verifier tokens.
      length: i32[B] tokens in `tokens` (prompt included).
      start: i32[B] the prompt length of each row.
      done: bool[B].
      row_keys: u32[B, 2]-like key data, one stream per row.
      vcache: the verifier's cache; it holds tokens[:length-1] (the last is the next root).
      dcaches: tuple of K drafter caches, each in its own token ids.
      dsynced: i32[K, B] committed verifier tokens already in each drafter's cache.
      dlogits: tuple of K f32[B, Vd] the drafter's logits after its cached tokens.
      counters: Counters.
    """

    tokens: jax.Array
    length: jax.Array
    start: jax.Array
    done: jax.Array
    row_keys: jax.Array
    vcache: Any
    dcaches: tuple
    dsynced: jax.Array
    dlogits: tuple
    counters: Counters

    def carry(self) -> "EngineState":
        return EngineState(
            tokens=self.tokens,
            length=self.length,
            vcache=self.vcache,
            dcaches=self.dcaches,
            dsynced=self.dsynced,
            dlogits=self.dlogits,
        )


@struct.dataclass
class EngineState:
    """What a later call needs to continue its rows (caches carried across plan steps).

    Attributes:
      tokens: i32[B, L] prompt then committed verifier tokens (L fixed by the first call).
      length: i32[B] tokens in `tokens`.
      vcache: the verifier's cache, holding tokens[:length-1].
      dcaches / dlogits: per drafter (of the call that made it), its cache and its
        logits after its cached tokens; empty for a verifier-only state.
      dsynced: i32[K, B] committed verifier tokens already in each drafter's cache (a
        drafter behind `length` catches up at the start of the next call).
    """

    tokens: jax.Array
    length: jax.Array
    vcache: Any
    dcaches: tuple
    dsynced: jax.Array
    dlogits: tuple

    def rows(self, idx) -> "EngineState":
        """The state of rows `idx` (i32[B']), e.g. a plan's committed branch copied into
        every branch row of the plan for its next step."""
        idx = jnp.asarray(idx, jnp.int32)
        take = lambda x: jnp.take(x, idx, axis=0)
        return EngineState(
            tokens=take(self.tokens),
            length=take(self.length),
            vcache=jax.tree.map(take, self.vcache),
            dcaches=jax.tree.map(take, self.dcaches),
            dsynced=jnp.take(self.dsynced, idx, axis=1),
            dlogits=jax.tree.map(take, self.dlogits),
        )

    def set_rows(self, idx, other: "EngineState") -> "EngineState":
        """This state with rows `idx` (i32[B']) replaced by the B' rows of `other`, e.g.
        new prompts prefilled into the rows a continuous batch freed
        (`specjax.engine.batching`); the inverse of `rows`.

        `other` must have this state's shapes but its row count (token buffer length,
        cache capacities, drafters). Indices ≥ B are dropped, so a refill padded to a
        fixed row count writes only its real rows (a negative index counts from the end,
        as in numpy). Jitted: one program per shape, in place when the caller donates the
        state."""
        return _set_rows(self, jnp.asarray(idx, jnp.int32), other)


@jax.jit
def _set_rows(state: EngineState, idx, other: EngineState) -> EngineState:
    put = lambda x, y: half_set(x, idx, y, mode='drop')
    return EngineState(
        tokens=put(state.tokens, other.tokens),
        length=put(state.length, other.length),
        vcache=jax.tree.map(put, state.vcache, other.vcache),
        dcaches=jax.tree.map(put, state.dcaches, other.dcaches),
        dsynced=state.dsynced.at[:, idx].set(other.dsynced, mode='drop'),
        dlogits=jax.tree.map(put, state.dlogits, other.dlogits),
    )


def count_round(
    c: Counters,
    v,
    slots,
    active,
    live,
    n_commit,
    gamma,
    n_drafters,
    coupled_rule: bool = False,
    slot_gamma=None,
) -> Counters:
    """The counters after one round's verdict `v` (`specjax.engine.decode`);
    `slot_gamma`: i32[B, S] the chain length γ_k of each slot (default: all γ)."""
    slot_gamma = jnp.full(slots.shape, gamma, jnp.int32) if slot_gamma is None else slot_gamma
    li = live.astype(jnp.int32)
    n = v.n
    from_draft = jnp.minimum(n, n_commit)
    multi = (jnp.sum(active, 1) >= 2) & live
    cut = (v.cut_at < slot_gamma) & active & live[:, None]  # bool[B, S]
    pruned = (v.pruned_at < gamma) & active & live[:, None]

    def per_drafter(x):  # i32[B, S, ...] by slot → i32[B, K, ...] by drafter
        onehot = (slots[:, :, None] == jnp.arange(n_drafters)[None, None, :]) & active[:, :, None]
        onehot = (onehot & live[:, None, None]).astype(jnp.int32)
        onehot = onehot.reshape(onehot.shape + (1,) * (x.ndim - 2))
        # A masked sum, not an einsum: elementwise work XLA fuses (an einsum is a dot).
        return jnp.sum(onehot * x[:, :, None], axis=1)

    j = jnp.arange(gamma)
    f = v.own_first_rejection[:, :, None]
    exists = j[None, None, :] < slot_gamma[:, :, None]  # positions a chain has
    own_acc = (j[None, None, :] < f).astype(jnp.int32)
    own_reach = ((j[None, None, :] <= f) & exists).astype(jnp.int32)
    m = v.match_lead[:, :, None]
    match_acc = (j[None, None, :] < m).astype(jnp.int32) * coupled_rule
    match_reach = ((j[None, None, :] <= m) & exists).astype(jnp.int32) * coupled_rule
    return Counters(
        rounds=c.rounds + li,
        committed=c.committed + n_commit,
        from_draft=c.from_draft + from_draft * li,
        reached=c.reached + v.reached * li,
        multi_rounds=c.multi_rounds + multi,
        multi_from_draft=c.multi_from_draft + from_draft * multi,
        multi_reached=c.multi_reached + v.reached * multi,
        truncations=c.truncations + jnp.sum(cut, 1),
        discarded=c.discarded + jnp.sum((slot_gamma - v.cut_at) * cut, 1),
        proposed=c.proposed + per_drafter(slot_gamma),
        accepted=c.accepted + per_drafter(v.accepted),
        rejected=c.rejected + per_drafter(v.rejected),
        own_accepted_at=c.own_accepted_at + per_drafter(own_acc),
        own_reached_at=c.own_reached_at + per_drafter(own_reach),
        pruned=c.pruned + jnp.sum(pruned, 1),
        pruned_discarded=c.pruned_discarded + jnp.sum((gamma - v.pruned_at) * pruned, 1),
        match_at=c.match_at + per_drafter(match_acc),
        match_reached_at=c.match_reached_at + per_drafter(match_reach),
        catchups=c.catchups,
        kept_expected=c.kept_expected + v.kept_expected * live,
        kept_rule1=c.kept_rule1 + v.kept_rule1 * live,
    )
