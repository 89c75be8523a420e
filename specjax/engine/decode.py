"""The speculative engine: prefill, one jitted round, and generation in `lax.while_loop`.

One round, for every row of the batch at once:

  1. each drafter consumes the committed verifier tokens it has not seen (through its
     re-tokenisation table) and drafts γ tokens in a `lax.scan` over its KV cache, sampling
     only tokens of the verifier's vocabulary (rule 3) — `q` recorded in verifier ids;
  2. the row's slots pick which drafters' chains the verifier sees (the policy decides);
  3. the verifier scores `[root] + S·γ` tokens in ONE call with a tree mask;
  4. a rule from `specjax.verify` decides (vmapped over rows);
  5. the committed tokens are written, the verifier's cache is compacted onto the
     committed path and every drafter's cache rolled back to what stays valid.

`generate` runs rounds in a `lax.while_loop` until every row is done: one host round-trip
per call. PRNG streams are folded from a per-row key and the row's absolute position
(`specjax.verify.streams`), so a row's output does not depend on the batch it is in.

Per-drafter γ_i (SPEC §2): drafter k drafts γ_k tokens; the verifier's block holds
max γ_k per chain. A row whose slot holds a shorter chain is verified on its γ_k drafts
(rows of one chain: the rule's decision is cut at γ_k and, if all γ_k passed, the bonus
is sampled from p after draft γ_k — the rule's decisions up to γ_k do not depend on the
padding, so this is exactly rule 1 with γ_k). Rows of several chains need equal γ.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import chex
import jax
import jax.numpy as jnp
from flax import struct

from specjax.engine.drafting import (  # noqa: F401  (consume, consume_width, pack_valid: API)
    Drafted,
    consume,
    consume_width,
    draft_all,
    draft_uniforms,
    pack_valid,
)
from specjax.engine.features import feature_layout, pick_features, reads_features
from specjax.engine.spec import EngineConfig
from specjax.engine.state import (
    Chains,
    Counters,
    DecodeState,
    EngineState,
    bool_V,
    by_position,
    check_shapes,
    count_round,
    f32_,
    i32_BS,
    i32_or_B,
)
from specjax.runtime import debug
from specjax.verify import registry
from specjax.verify.distributions import gumbel_argmax, sampling_probs
from specjax.verify.streams import (
    STREAM_BONUS,
    STREAM_VERIFY,
    fold_keys,
    gumbel_noise,
    sample_rows,
)


def tree_block_mask(n_slots: int, gamma: int) -> jax.Array:
    """bool[1+Sγ, 1+Sγ]: root, then S chains; chain token j sees root and its chain ≤ j."""
    t = 1 + n_slots * gamma
    idx = jnp.arange(t)
    chain = jnp.where(idx == 0, -1, (idx - 1) // gamma)
    depth = jnp.where(idx == 0, 0, (idx - 1) % gamma + 1)
    same = (chain[:, None] == chain[None, :]) & (depth[None, :] <= depth[:, None])
    return same | (idx[None, :] == 0)


def _tree_depths(n_slots: int, gamma: int) -> jax.Array:
    idx = jnp.arange(1 + n_slots * gamma)
    return jnp.where(idx == 0, 0, (idx - 1) % gamma + 1)


@struct.dataclass(kw_only=True)
class RoundInputs:
    """What every round of a speculative call reads besides its state: the program's inputs,
    never compiled into it (the jitted programs take them positionally, in this order: `of`).

    Attributes:
      v_params: the verifier's parameters.
      d_data: each drafter's `DrafterData` (parameters, id maps, temperature).
      slots: i32[B, S] drafter indices per row in priority order, -1 = empty.
      stop_table: bool[V] verifier tokens that end a row.
      v_temperature: f32[] the verifier's τ (None: the config's).
      max_new: i32[] or i32[B] the token budget (None: the config's).
    """

    v_params: Any
    d_data: tuple
    slots: i32_BS
    stop_table: bool_V
    v_temperature: f32_ | None = None
    max_new: i32_or_B | None = None

    @classmethod
    def of(cls, *head) -> "RoundInputs":
        """The inputs from the arguments a speculative program opens with (v_params, d_data,
        slots, stop_table, v_temperature, max_new)."""
        return by_position(cls, head)


@dataclasses.dataclass(frozen=True)
class SpecLoop:
    """A speculative call's loop: its static parts (hashable; a jitted program's static
    arguments), the rounds as methods over the loop state (`DecodeState`) and the call's
    inputs (`RoundInputs`): `start` the state, `round` one round, `run` rounds until every
    row is done (`lax.while_loop(cond, round, state)`), `catch_up` the drafters behind a
    carried state's text.

    Attributes:
      cfg: the engine configuration (static: γ, rule, slots).
      verifier: the verifier's functional LM.
      drafters: the drafters' static parts (`DrafterStatic`).
    """

    cfg: EngineConfig
    verifier: Any
    drafters: tuple

    @property
    def gammas(self) -> tuple[int, ...]:
        """Each drafter's window γ_k."""
        return tuple(d.own_gamma(self.cfg.gamma) for d in self.drafters)

    def start(self, carry: EngineState, row_keys, max_new, catchups=None) -> DecodeState:
        """The loop state a call starts from: `carry`'s rows with fresh counters (their
        `catchups` given), each row's start at its length, and rows without budget (of
        `max_new`, i32[] or i32[B]) already done."""
        b = carry.tokens.shape[0]
        gamma = max(self.gammas)
        counters = Counters.zeros(b, len(self.drafters), gamma)
        if catchups is not None:
            counters = counters.replace(catchups=catchups)
        state = DecodeState(
            tokens=carry.tokens,
            length=carry.length,
            start=carry.length,
            done=jnp.zeros((b,), bool),
            row_keys=row_keys,
            vcache=carry.vcache,
            dcaches=carry.dcaches,
            dsynced=carry.dsynced,
            dlogits=carry.dlogits,
            counters=counters,
        )
        return state.replace(done=round_budget(self.cfg, state, max_new, gamma) <= 0)

    def run(self, inputs: RoundInputs, state: DecodeState, after=None) -> DecodeState:
        """Rounds until every row is done; `after` (DecodeState → DecodeState) follows each
        round (continuous batching pauses its rows there). Shapes checked while tracing."""
        check_shapes(inputs, state)
        step = functools.partial(self.round, inputs)
        if after is not None:
            step = lambda s: after(self.round(inputs, s))  # noqa: E731
        return jax.lax.while_loop(lambda s: ~jnp.all(s.done), step, state)

    def round(self, inputs: RoundInputs, state: DecodeState) -> DecodeState:
        """One round for every row (see the module docstring)."""
        cfg, drafters = self.cfg, self.drafters
        s_n = cfg.n_slots
        gammas = self.gammas
        gamma = max(gammas)  # block width per chain
        ragged = len(set(gammas)) > 1  # rows of one chain, per-drafter γ
        v_vocab = self.verifier.vocab_size
        live = ~state.done
        length = state.length
        coupled = registry.get(cfg.rule).coupled
        gumbel = gumbel_noise(state.row_keys, length, gamma, v_vocab) if coupled else None
        u_draft = None if coupled else draft_uniforms(state.row_keys, length, len(drafters), gamma)

        drafted = draft_all(
            cfg, drafters, inputs.d_data, state, gammas, u_draft, gumbel, v_vocab, inputs.slots
        )
        chains = _chains(drafted, inputs.slots, gammas, s_n)
        check_shapes(state, chains)  # B, and G: the counters' widest window is the block's
        request, picks = feature_layout(self.verifier, [d.lm for d in drafters])
        feature_drafters = [k for k, pick in enumerate(picks) if pick is not None]
        p_root, p_nodes, vcache, hidden = self._score(inputs, state, chains.chain, request)
        verdict = self._decide(state, gumbel, p_root, p_nodes, chains, ragged)

        # 5. Commit: stop at a stop token or the budget (both stopping times: still exact).
        idx = jnp.arange(gamma + 1)  # block indices, root included
        n_commit, first_stop, budget = _commit_counts(cfg, inputs, state, live, verdict, idx)
        tokens = _write_tokens(state.tokens, verdict.tokens, length, n_commit, idx)
        vcache = _keep_verifier_path(self.verifier, vcache, verdict, n_commit, s_n, gamma)
        new_dcaches, new_synced = self._keep_drafter_paths(
            drafted, chains, verdict, live, n_commit, length
        )
        if feature_drafters:  # the verifier's features along the committed path
            path = _path_indices(verdict, n_commit.shape[0], s_n, gamma)
            feats = jnp.take_along_axis(hidden, path[:, :, None], axis=1)  # [B, γ+1, n·D]
            for k in feature_drafters:
                new_dcaches[k] = drafters[k].lm.write_features(
                    new_dcaches[k], pick_features(feats, picks[k], request), length - 1, n_commit
                )
        new_length = length + n_commit
        # SPEC §9, caches rolled back: the verifier's cache holds every committed token but
        # the last (a row at capacity keeps what fits).
        debug.check(
            ~live | (vcache.length == jnp.minimum(new_length - 1, _capacity(vcache))),
            "verifier cache length != committed tokens - 1 after a round",
        )
        done = (
            state.done
            | (new_length - state.start >= budget + (length - state.start))
            | (live & (first_stop <= verdict.n))
        )

        counters = count_round(
            state.counters,
            verdict,
            chains,
            live,
            n_commit,
            n_drafters=len(drafters),
            coupled_rule=coupled,
        )
        return state.replace(
            tokens=tokens,
            length=new_length,
            done=done,
            vcache=vcache,
            dcaches=tuple(new_dcaches),
            dsynced=jnp.stack(new_synced),
            dlogits=tuple(drafted.dlogits),
            counters=counters,
        )

    def catch_up(self, d_data, carry: EngineState) -> tuple[EngineState, jax.Array]:
        """Drafters behind the committed text (a verifier-only step, a fallback) consume it
        before the first round of a call that continues a state, up to γ + 1 verifier tokens
        per forward (fewer where another tokenizer's pieces do not fit the block) — (the
        state, catchups i32[B, K] the forwards each row needed)."""
        gamma = max(self.gammas)
        dcaches, dlogits, dsynced, passes = [], [], [], []
        for kk, (spec, data) in enumerate(zip(self.drafters, d_data)):

            def behind(c):
                return jnp.any(c[2] < carry.length)

            def feed(c, spec=spec, data=data):
                cache, logits, synced, n = c
                n = n + (synced < carry.length).astype(jnp.int32)
                cache, logits, synced, _ = consume(
                    spec, data, cache, logits, carry.tokens, synced, carry.length, gamma + 1
                )
                return cache, logits, synced, n

            c = jax.lax.while_loop(
                behind,
                feed,
                (
                    carry.dcaches[kk],
                    carry.dlogits[kk],
                    carry.dsynced[kk],
                    jnp.zeros(carry.length.shape, jnp.int32),
                ),
            )
            dcaches.append(c[0])
            dlogits.append(c[1])
            dsynced.append(c[2])
            passes.append(c[3])
        carry = carry.replace(
            dcaches=tuple(dcaches), dlogits=tuple(dlogits), dsynced=jnp.stack(dsynced)
        )
        return carry, jnp.stack(passes, 1)

    def _score(self, inputs: RoundInputs, state: DecodeState, chain, with_hidden=False):
        """Step 3: one verifier call over the tree `[root] + S·γ` — (p_root f32[B, V],
        p_nodes f32[B, S, γ, V], the verifier's cache with the block written, not yet
        committed, and with ``with_hidden`` its hidden states [B, 1 + S·γ, D] for feature
        drafters (a tuple: those states, [.., n·D], `feature_layout`), else None)."""
        cfg, verifier = self.cfg, self.verifier
        b, s_n, gamma = chain.shape
        length = state.length
        root = jnp.take_along_axis(state.tokens, (length - 1)[:, None], axis=1)
        block = jnp.concatenate([root, chain.reshape(b, s_n * gamma)], axis=1)
        positions = (length - 1)[:, None] + _tree_depths(s_n, gamma)[None, :]
        mask = jnp.broadcast_to(tree_block_mask(s_n, gamma), (b,) + (1 + s_n * gamma,) * 2)
        if with_hidden:
            layers = {} if with_hidden is True else {'layers': with_hidden}
            v_logits, hidden, vcache = verifier.forward_hidden(
                inputs.v_params, state.vcache, block, positions, mask, **layers
            )
        else:
            v_logits, vcache = verifier.forward(
                inputs.v_params, state.vcache, block, positions, mask
            )
            hidden = None
        v_temperature = inputs.v_temperature
        v_temperature = cfg.verifier_temperature if v_temperature is None else v_temperature
        p = sampling_probs(
            v_logits, v_temperature, top_k=cfg.verifier_top_k, top_p=cfg.verifier_top_p
        )
        debug.check_distribution(p, 'verifier p')
        return p[:, 0], p[:, 1:].reshape(b, s_n, gamma, verifier.vocab_size), vcache, hidden

    def _decide(self, state: DecodeState, gumbel, p_root, p_nodes, chains: Chains, ragged: bool):
        """Step 4: the config's rule from `specjax.verify`, vmapped over rows; `ragged`
        (rows of one chain whose γ_k differ): cut to each row's γ_k."""
        rule = registry.get(self.cfg.rule)
        # (A coupled rule's key only drives the per-drafter Leviathan test: a measurement,
        # SPEC §7; `gumbel` is None for the other rules.)
        verify_keys = fold_keys(state.row_keys, STREAM_VERIFY, state.length)
        verdict = jax.vmap(rule.verify)(
            verify_keys, p_root, p_nodes, chains.q, chains.chain, chains.active, gumbel
        )
        if ragged:
            verdict = _cut_to_window(
                verdict,
                chains.slot_gamma[:, 0],
                p_nodes[:, 0],
                gumbel,
                fold_keys(state.row_keys, STREAM_BONUS, state.length),
            )
        return verdict

    def _keep_drafter_paths(
        self, drafted: Drafted, chains: Chains, verdict, live, n_commit, length
    ) -> tuple[list, list]:
        """Each drafter's cache rolled back to the drafts of its own chain that were
        committed — (caches, synced i32[B] per drafter)."""
        slots = chains.slots
        slot_match = jnp.where(chains.active, verdict.matched, 0)
        new_dcaches, new_synced = [], []
        for k, (spec, gamma_k) in enumerate(zip(self.drafters, self.gammas)):
            mine = jnp.max(jnp.where(slots == k, slot_match, 0), axis=1)
            synced, caught_up = drafted.synced[k], drafted.caught_up[k]
            # Its drafts followed the committed text only if it had caught up before drafting.
            keep = jnp.where(
                live & caught_up, jnp.minimum(jnp.minimum(mine, n_commit), gamma_k - 1), 0
            )
            if reads_features(spec):  # its drafts read its own features: re-read them
                keep = jnp.zeros_like(keep)
            new_dcaches.append(spec.lm.rollback(drafted.dcaches[k], drafted.base_len[k] + keep))
            new_synced.append(jnp.where(caught_up, length + keep, synced))
        return new_dcaches, new_synced


def positional(round_fn):
    """`round_fn(loop, inputs, state)` called with the loop's parts one by one, as older
    copies of the package call a round (`speculative_round`; experiments/profile_round.py
    times them side by side, and its scratch rounds, `specjax.measure.round_anatomy`)."""

    def call(
        cfg, verifier, drafters, v_params, d_data, slots, stop_table, state, v_temperature=None,
        max_new=None,
    ) -> DecodeState:  # fmt: skip
        head = (v_params, d_data, slots, stop_table, v_temperature, max_new)
        return round_fn(SpecLoop(cfg, verifier, tuple(drafters)), RoundInputs.of(*head), state)

    return call


#: One round, `SpecLoop.round`, with the signature older copies of the package have:
#: (cfg, verifier, drafters, v_params, d_data, slots, stop_table, state, v_temperature=None,
#: max_new=None) → DecodeState.
speculative_round = positional(SpecLoop.round)


def _chains(drafted: Drafted, slots, gammas, n_slots: int) -> Chains:
    """Step 2: the row's slots pick its chains."""
    drafts, qs = drafted.drafts, drafted.qs
    b, _, gamma = drafts.shape
    active = slots >= 0
    sl = jnp.maximum(slots, 0)
    if len(gammas) == 1:  # every slot holds drafter 0 (or nothing): no gathers
        chain = jnp.broadcast_to(drafts, (b, n_slots, gamma))
        chain_q = jax.tree_util.tree_map(
            lambda a: jnp.broadcast_to(a, (b, n_slots, gamma) + a.shape[3:]), qs
        )
    else:
        chain = jnp.take_along_axis(drafts, sl[:, :, None], axis=1)  # [B, S, γ]
        chain_q = jax.tree_util.tree_map(  # [B, S, γ, V or W] (sl is in range: no masking)
            lambda a: jnp.take_along_axis(a, sl[:, :, None, None], axis=1, mode='clip'), qs
        )
    chain = jnp.where(active[:, :, None], chain, 0)
    slot_gamma = jnp.asarray(gammas, jnp.int32)[sl]  # i32[B, S]
    return Chains(slots=slots, chain=chain, q=chain_q, active=active, slot_gamma=slot_gamma)


def _commit_counts(cfg: EngineConfig, inputs: RoundInputs, state: DecodeState, live, verdict, idx):
    """Tokens each row commits: the verdict's, cut after a stop token and at the budget
    (0 for a row no longer `live`) — (n_commit i32[B], first_stop i32[B] the block index
    of the first stop token or γ + 1, budget i32[B]). `idx`: i32[γ+1] the block's indices."""
    b = state.tokens.shape[0]
    gamma = idx.shape[0] - 1
    n = verdict.n
    is_stop = inputs.stop_table[verdict.tokens] & (idx[None, :] <= n[:, None])
    first_stop = jnp.where(jnp.any(is_stop, 1), jnp.argmax(is_stop, 1), gamma + 1)
    budget = round_budget(cfg, state, inputs.max_new, gamma)
    n_commit = jnp.minimum(jnp.minimum(n + 1, first_stop + 1), budget)
    n_commit = jnp.where(live, n_commit, 0)
    chex.assert_shape(n_commit, (b,))
    debug.check_range(
        jnp.where(live, n_commit, 1), 1, gamma + 1, 'tokens committed per round (SPEC §9)'
    )
    return n_commit, first_stop, budget


def _write_tokens(tokens, new, length, n_commit, idx):
    """The token buffer with each row's first `n_commit` of `new` i32[B, γ+1] written at
    its `length` (`idx`: i32[γ+1] the block's indices)."""

    def write(row, new, at, cnt):
        old = jax.lax.dynamic_slice(row, (at,), (idx.shape[0],))
        return jax.lax.dynamic_update_slice(row, jnp.where(idx < cnt, new, old), (at,))

    return jax.vmap(write)(tokens, new, length, n_commit)


def _keep_verifier_path(verifier, vcache, verdict, n_commit, n_slots: int, gamma: int):
    """The verifier's cache keeps the root and the first n_commit − 1 committed drafts
    (the accepted path compacted into place when the block is a tree)."""
    # The root and the first n_commit − 1 drafts are now history (a row that stopped early
    # keeps nothing past its last committed token, so a continued call starts clean).
    if n_slots == 1:
        # One chain: the accepted path is the block's own prefix, nothing to move.
        return verifier.advance(vcache, n_commit)
    return verifier.compact(
        vcache, _path_indices(verdict, n_commit.shape[0], n_slots, gamma), n_commit
    )


def _path_indices(verdict, b: int, n_slots: int, gamma: int) -> jax.Array:
    """i32[B, γ+1]: the block indices of the root and the committed path's drafts."""
    if n_slots == 1:
        return jnp.broadcast_to(jnp.arange(gamma + 1, dtype=jnp.int32), (b, gamma + 1))
    return jnp.concatenate(
        [jnp.zeros((b, 1), jnp.int32), 1 + verdict.path_slot * gamma + jnp.arange(gamma)[None, :]],
        1,
    ).astype(jnp.int32)


def _capacity(cache):
    """A cache's slots per row, or 'unbounded' for caches that store no slots."""
    return getattr(cache, 'max_len', jnp.iinfo(jnp.int32).max)


def round_budget(cfg: EngineConfig, state: DecodeState, max_new=None, gamma=None) -> jax.Array:
    """i32[B] tokens a row may still commit: its `max_new_tokens` and the room left in the
    token buffer (a continued call cannot outgrow the buffer of the call that began it)."""
    max_new = cfg.max_new_tokens if max_new is None else max_new
    gamma = cfg.gamma if gamma is None else gamma  # the block's γ (max γ_i)
    room = state.tokens.shape[1] - (gamma + 1) - state.length
    return jnp.minimum(max_new - (state.length - state.start), room)


def _cut_to_window(v, row_gamma, p_chain, gumbel, bonus_keys):
    """Rows of one chain whose drafter has γ_k below the block's γ: the rule's verdict cut
    at γ_k (its decisions there never looked past γ_k) and, where all γ_k drafts passed,
    the bonus drawn from p after draft γ_k (Leviathan's rule with γ_k, exactly)."""
    n = v.n
    over = n >= row_gamma
    n_t = jnp.minimum(n, row_gamma)
    last = jnp.take_along_axis(p_chain, (row_gamma - 1)[:, None, None], axis=1)[:, 0]  # [B, V]
    if gumbel is None:
        bonus = sample_rows(bonus_keys, last)
    else:
        g = jnp.take_along_axis(gumbel, row_gamma[:, None, None], axis=1)[:, 0]
        bonus = gumbel_argmax(last, g)
    idx = jnp.arange(v.tokens.shape[1])[None, :]
    tokens = jnp.where(over[:, None] & (idx == n_t[:, None]), bonus[:, None], v.tokens)
    tokens = jnp.where(idx > n_t[:, None], 0, tokens)
    g1 = row_gamma[:, None]
    gamma = v.path_slot.shape[1]
    return v.replace(
        n=n_t,
        tokens=tokens,
        accepted=jnp.minimum(v.accepted, g1),
        rejected=v.rejected * (~over)[:, None],
        matched=jnp.minimum(v.matched, n_t[:, None]),
        own_first_rejection=jnp.minimum(v.own_first_rejection, g1),
        reached=jnp.minimum(n_t + 1, row_gamma),
        cut_at=jnp.where(v.cut_at < g1, v.cut_at, gamma),
        match_lead=jnp.minimum(v.match_lead, g1),
    )
