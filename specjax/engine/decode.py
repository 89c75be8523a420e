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
per call. PRNG streams are folded from a per-row key and the row's absolute position, so
a row's output does not depend on the batch it is in.
"""
from __future__ import annotations

import functools
from typing import Any, Sequence

import chex
import jax
import jax.numpy as jnp
from flax import struct

from specjax.engine.spec import DrafterData, DrafterSpec, EngineConfig
from specjax.verify import rules as rules_lib
from specjax.verify.distributions import (gumbel_argmax, sample, sampling_probs,
                                          to_verifier_space)

_STREAM_DRAFT, _STREAM_VERIFY, _STREAM_NOISE = 1, 2, 3


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
      truncations: i32[B] rounds cut before the end of the block.
      discarded: i32[B] draft positions of the block discarded by those cuts.
      proposed: i32[B, K] drafts proposed by each drafter (γ per round it took part in).
      accepted / rejected: i32[B, K] drafts accepted / rejections, attributed per drafter.
      own_accepted_at / own_reached_at: i32[B, K, γ] each drafter's chain tested alone
        against p, per position (per-drafter and independent-branch acceptance).
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

    @classmethod
    def zeros(cls, batch: int, n_drafters: int, gamma: int) -> "Counters":
        z = lambda *s: jnp.zeros(s, jnp.int32)
        return cls(z(batch), z(batch), z(batch), z(batch), z(batch), z(batch), z(batch),
                   z(batch), z(batch), z(batch, n_drafters), z(batch, n_drafters),
                   z(batch, n_drafters), z(batch, n_drafters, gamma),
                   z(batch, n_drafters, gamma))


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


def _causal(batch: int, t: int) -> jax.Array:
    return jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (batch, t, t))


def _keys(row_keys: jax.Array, *folds) -> jax.Array:
    """Per-row keys folded with per-row (array) or shared (int) values."""
    def one(k, *f):
        k = jax.random.wrap_key_data(k)
        for x in f:
            k = jax.random.fold_in(k, x)
        return k
    axes = (0,) + tuple(0 if jnp.ndim(f) else None for f in folds)
    return jax.vmap(one, in_axes=axes)(row_keys, *folds)


def _gumbel(row_keys, length, gamma, vocab):
    """f32[B, γ+1, V]: the noise of absolute positions length..length+γ (rule 4)."""
    def one(k, n):
        k = jax.random.wrap_key_data(k)
        ks = jax.vmap(lambda j: jax.random.fold_in(jax.random.fold_in(k, _STREAM_NOISE),
                                                   n + j))(jnp.arange(gamma + 1))
        return jax.vmap(lambda kk: jax.random.gumbel(kk, (vocab,)))(ks)
    return jax.vmap(one)(row_keys, length)


def _pack(ids: jax.Array, valid: jax.Array):
    """Moves valid entries of i32[B, N] to the front, keeping their order."""
    order = jnp.argsort(~valid, axis=-1, stable=True)
    return jnp.take_along_axis(ids, order, axis=-1), jnp.sum(valid, axis=-1)


def consume_width(data_retok_m: int, tokens: int) -> int:
    """Static width (drafter tokens) of the block that feeds `tokens` verifier tokens.

    A drafter of another tokenizer may spell a rare verifier token in many pieces (a run of
    indentation is one verifier token and 16 prose tokens); sizing the block for that worst
    case would make every round pay for it. The block holds two pieces per token on average
    (at least the worst single token); what does not fit stays pending for the next round.
    """
    return min(tokens * data_retok_m, max(2 * tokens, data_retok_m))


def _consume(spec: DrafterSpec, data: DrafterData, cache, logits, tokens, synced, length,
             width: int):
    """Feeds committed verifier tokens [synced, length) (≤ width of them) to one drafter.

    Whole verifier tokens are fed while their pieces fit in the block; the rest stay
    pending. Returns (cache, logits after the last fed token, synced after feeding,
    caught_up: bool[B] whether every committed token is now in the drafter's cache).
    """
    b = tokens.shape[0]
    m = data.retok.shape[1]
    w = consume_width(m, width)
    i = jnp.arange(width)
    pos = synced[:, None] + i[None, :]
    vt = jnp.take_along_axis(tokens, jnp.minimum(pos, tokens.shape[1] - 1), axis=1)
    pieces = jnp.where(pos < length[:, None], data.retok_len[vt], 0)          # [B, width]
    fits = jnp.cumsum(pieces, axis=1) <= w
    take = jnp.minimum(jnp.sum(jnp.cumprod(fits.astype(jnp.int32), axis=1), axis=1),
                       jnp.maximum(length - synced, 0))                      # whole tokens
    valid = ((i[None, :] < take[:, None])[:, :, None]
             & (jnp.arange(m)[None, None, :] < data.retok_len[vt][:, :, None]))
    ids, n = _pack(data.retok[vt].reshape(b, width * m), valid.reshape(b, width * m))
    ids = ids[:, :w]
    positions = cache.length[:, None] + jnp.arange(w)[None, :]
    block_logits, cache = spec.lm.forward(data.params, cache, ids, positions,
                                          _causal(b, w) & (n >= 0)[:, None, None])
    last = jnp.take_along_axis(block_logits, jnp.maximum(n - 1, 0)[:, None, None], axis=1)[:, 0]
    logits = jnp.where((n > 0)[:, None], last, logits)
    synced = synced + take
    return spec.lm.advance(cache, n), logits, synced, synced >= length


def _draft(cfg: EngineConfig, k: int, spec: DrafterSpec, data: DrafterData, cache, logits,
           row_keys, length, gumbel, v_vocab: int):
    """γ drafts of one drafter: (drafts i32[B,γ] verifier ids, q f32[B,γ,Vv], cache)."""
    b = logits.shape[0]
    mask = data.to_verifier >= 0

    def sample_at(logits, j):
        temperature = spec.temperature if data.temperature is None else data.temperature
        q_d = sampling_probs(logits, temperature, top_k=spec.top_k, top_p=spec.top_p,
                             mask=mask)
        q_v = to_verifier_space(q_d, data.to_verifier, v_vocab)
        if cfg.rule in rules_lib.COUPLED_RULES:
            x = gumbel_argmax(q_v, gumbel[:, j])
        else:
            x = jax.vmap(sample)(_keys(row_keys, _STREAM_DRAFT, length, k, j), q_v)
        return x, q_v

    def step(carry, j):
        cache, logits = carry
        x, q_v = sample_at(logits, j)
        new_logits, new_cache = spec.lm.forward(
            data.params, cache, data.from_verifier[x][:, None], cache.length[:, None],
            _causal(b, 1))
        new_cache = spec.lm.advance(new_cache, jnp.ones((b,), jnp.int32))
        return (new_cache, new_logits[:, 0]), (x, q_v)

    # γ − 1 forwards: x_1 comes from the logits the drafter already has, and x_γ is not fed
    # (if it is committed, next round's consume feeds it with the verifier's token).
    (cache, logits), (xs, qs) = jax.lax.scan(step, (cache, logits), jnp.arange(cfg.gamma - 1))
    x_last, q_last = sample_at(logits, cfg.gamma - 1)
    xs = jnp.concatenate([xs, x_last[None]], 0)
    qs = jnp.concatenate([qs, q_last[None]], 0)
    return xs.T, jnp.swapaxes(qs, 0, 1), cache


def speculative_round(cfg: EngineConfig, verifier, drafters: Sequence[DrafterSpec],
                      v_params, d_data: Sequence[DrafterData], slots: jax.Array,
                      stop_table: jax.Array, state: DecodeState) -> DecodeState:
    """One round for every row (see the module docstring). `slots`: i32[B, S] drafter ids."""
    gamma, s_n = cfg.gamma, cfg.n_slots
    b = state.tokens.shape[0]
    v_vocab = verifier.vocab_size
    live = ~state.done
    length = state.length
    gumbel = (_gumbel(state.row_keys, length, gamma, v_vocab)
              if cfg.rule in rules_lib.COUPLED_RULES
              else None)

    # 1. Drafting. A lone drafter always proposed the committed path, so at most two
    # committed tokens are new to it (x_γ and the bonus); otherwise up to γ + 1.
    width = 2 if (len(drafters) == 1 and s_n == 1) else gamma + 1
    drafts, qs, dcaches, base_len, dlogits, fed = [], [], [], [], [], []
    for k, (spec, data) in enumerate(zip(drafters, d_data)):
        cache, logits, synced, caught_up = _consume(
            spec, data, state.dcaches[k], state.dlogits[k], state.tokens, state.dsynced[k],
            length, min(width, gamma + 1))
        base_len.append(cache.length)
        fed.append((synced, caught_up))
        dlogits.append(logits)
        x, q, cache = _draft(cfg, k, spec, data, cache, logits, state.row_keys, length,
                             gumbel, v_vocab)
        drafts.append(x)
        qs.append(q)
        dcaches.append(cache)
    drafts = jnp.stack(drafts, 1)                         # i32[B, K, γ]
    qs = jnp.stack(qs, 1)                                 # f32[B, K, γ, V]

    # 2. Slots → chains.
    active = slots >= 0
    sl = jnp.maximum(slots, 0)
    chain = jnp.take_along_axis(drafts, sl[:, :, None], axis=1)            # [B, S, γ]
    chain_q = jnp.take_along_axis(qs, sl[:, :, None, None], axis=1)        # [B, S, γ, V]
    chain = jnp.where(active[:, :, None], chain, 0)

    # 3. One verifier call over the tree.
    root = jnp.take_along_axis(state.tokens, (length - 1)[:, None], axis=1)
    block = jnp.concatenate([root, chain.reshape(b, s_n * gamma)], axis=1)
    positions = (length - 1)[:, None] + _tree_depths(s_n, gamma)[None, :]
    mask = jnp.broadcast_to(tree_block_mask(s_n, gamma), (b,) + (1 + s_n * gamma,) * 2)
    v_logits, vcache = verifier.forward(v_params, state.vcache, block, positions, mask)
    p = sampling_probs(v_logits, cfg.verifier_temperature, top_k=cfg.verifier_top_k,
                       top_p=cfg.verifier_top_p)
    p_root, p_nodes = p[:, 0], p[:, 1:].reshape(b, s_n, gamma, v_vocab)

    # 4. The rule.
    rule = getattr(rules_lib, cfg.rule)
    first_arg = (gumbel if cfg.rule in rules_lib.COUPLED_RULES
                 else _keys(state.row_keys, _STREAM_VERIFY, length))
    verdict = jax.vmap(rule)(first_arg, p_root, p_nodes, chain_q, chain, active)

    # 5. Commit: stop at a stop token or the budget (both stopping times: still exact).
    n = verdict.n
    idx = jnp.arange(gamma + 1)
    is_stop = stop_table[verdict.tokens] & (idx[None, :] <= n[:, None])
    first_stop = jnp.where(jnp.any(is_stop, 1), jnp.argmax(is_stop, 1), gamma + 1)
    budget = cfg.max_new_tokens - (length - state.start)
    n_commit = jnp.minimum(jnp.minimum(n + 1, first_stop + 1), budget)
    n_commit = jnp.where(live, n_commit, 0)
    chex.assert_shape(n_commit, (b,))

    def write(row, new, at, cnt):
        old = jax.lax.dynamic_slice(row, (at,), (gamma + 1,))
        return jax.lax.dynamic_update_slice(row, jnp.where(idx < cnt, new, old), (at,))
    tokens = jax.vmap(write)(state.tokens, verdict.tokens, length, n_commit)

    src = jnp.concatenate([jnp.zeros((b, 1), jnp.int32),
                           1 + verdict.path_slot * gamma + jnp.arange(gamma)[None, :]], 1)
    keep_v = jnp.where(live, n + 1, 0)
    vcache = verifier.compact(vcache, src, keep_v)

    # Drafter k keeps the drafts of its own chain that were committed.
    slot_match = jnp.where(active, verdict.matched, 0)
    new_dcaches, new_synced = [], []
    for k, spec in enumerate(drafters):
        mine = jnp.max(jnp.where(slots == k, slot_match, 0), axis=1)
        synced, caught_up = fed[k]
        # Its drafts followed the committed text only if it had caught up before drafting.
        keep = jnp.where(live & caught_up,
                         jnp.minimum(jnp.minimum(mine, n_commit), gamma - 1), 0)
        new_dcaches.append(spec.lm.rollback(dcaches[k], base_len[k] + keep))
        new_synced.append(jnp.where(caught_up, length + keep, synced))
    new_length = length + n_commit
    generated = new_length - state.start
    done = state.done | (generated >= cfg.max_new_tokens) | (live & (first_stop <= n))

    counters = _count(state.counters, verdict, slots, active, live, n_commit, gamma,
                      len(drafters))
    return state.replace(tokens=tokens, length=new_length, done=done, vcache=vcache,
                         dcaches=tuple(new_dcaches), dsynced=jnp.stack(new_synced),
                         dlogits=tuple(dlogits), counters=counters)


def _count(c: Counters, v, slots, active, live, n_commit, gamma, n_drafters) -> Counters:
    li = live.astype(jnp.int32)
    n = v.n
    from_draft = jnp.minimum(n, n_commit)
    multi = (jnp.sum(active, 1) >= 2) & live
    trunc = (n < gamma) & live

    def per_drafter(x):  # i32[B, S, ...] by slot → i32[B, K, ...] by drafter
        onehot = (slots[:, :, None] == jnp.arange(n_drafters)[None, None, :]) & active[:, :, None]
        return jnp.einsum("bsk,bs...->bk...", onehot.astype(jnp.int32), x) * (
            li.reshape((-1,) + (1,) * (x.ndim - 1)))

    j = jnp.arange(gamma)
    f = v.own_first_rejection[:, :, None]
    own_acc = (j[None, None, :] < f).astype(jnp.int32)
    own_reach = (j[None, None, :] <= f).astype(jnp.int32)
    return Counters(
        rounds=c.rounds + li,
        committed=c.committed + n_commit,
        from_draft=c.from_draft + from_draft * li,
        reached=c.reached + v.reached * li,
        multi_rounds=c.multi_rounds + multi,
        multi_from_draft=c.multi_from_draft + from_draft * multi,
        multi_reached=c.multi_reached + v.reached * multi,
        truncations=c.truncations + trunc,
        discarded=c.discarded + (gamma - n) * trunc,
        proposed=c.proposed + per_drafter(jnp.full(slots.shape, gamma, jnp.int32)),
        accepted=c.accepted + per_drafter(v.accepted),
        rejected=c.rejected + per_drafter(v.rejected),
        own_accepted_at=c.own_accepted_at + per_drafter(own_acc),
        own_reached_at=c.own_reached_at + per_drafter(own_reach))
