"""Step 1 of a round: each drafter consumes the committed tokens new to it and drafts.

`consume` feeds committed verifier tokens (through a drafter's re-tokenisation table) into
its cache; `draft_chain` draws γ_k tokens in verifier ids with their `q`; `draft_all` runs
both for every drafter of a call, twins (one drafter named several times,
`DrafterStatic.shares`) in one batched pass (`draft_group`), their first drafts drawn
without replacement under `token_tree`.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp

from specjax.engine.features import reads_features
from specjax.engine.spec import DrafterData, DrafterStatic, EngineConfig
from specjax.engine.state import DecodeState
from specjax.models.api import causal_block_mask, forward_rows
from specjax.models.drafter_kinds import kind_of
from specjax.verify import registry
from specjax.verify.distributions import gumbel_argmax, sampling_probs, to_verifier_space
from specjax.verify.qlaw import SparseQ, check_q, on_ids, point_mass, q_dense, widen
from specjax.verify.streams import (
    STREAM_DRAFT,
    argmax_first,
    fold_data,
    sample_rows_u,
    uniform_data,
)


def pack_valid(ids: jax.Array, valid: jax.Array):
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


def consume(
    spec: DrafterStatic, data: DrafterData, cache, logits, tokens, synced, length, width: int
):
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
    if data.identity:  # one piece per token, already in place: every pending token fits
        take = jnp.clip(length - synced, 0, width)  # (w == width)
        ids, n = jnp.where(i[None, :] < take[:, None], vt, 0), take
    else:
        pieces = jnp.where(pos < length[:, None], data.retok_len[vt], 0)  # [B, width]
        fits = jnp.cumsum(pieces, axis=1) <= w
        take = jnp.minimum(
            jnp.sum(jnp.cumprod(fits.astype(jnp.int32), axis=1), axis=1),
            jnp.maximum(length - synced, 0),
        )  # whole tokens
        valid = (i[None, :] < take[:, None])[:, :, None] & (
            jnp.arange(m)[None, None, :] < data.retok_len[vt][:, :, None]
        )
        ids, n = pack_valid(data.retok[vt].reshape(b, width * m), valid.reshape(b, width * m))
        ids = ids[:, :w]
    positions = cache.length[:, None] + jnp.arange(w)[None, :]
    # Only the logits after the last fed piece are read: the head runs on that row alone.
    last, cache = forward_rows(
        spec.lm,
        data.params,
        cache,
        ids,
        positions,
        causal_block_mask(b, w) & (n >= 0)[:, None, None],
        jnp.maximum(n - 1, 0)[:, None],
    )
    last = last[:, 0]
    logits = jnp.where((n > 0)[:, None], last, logits)
    synced = synced + take
    return spec.lm.advance(cache, n), logits, synced, synced >= length


def draw(
    coupled: bool, spec: DrafterStatic, data: DrafterData, v_vocab: int, logits, z, exclude=None
):
    """(x in verifier ids, x in the drafter's ids, q in verifier ids) of one draw from a
    drafter's `logits` with noise `z` (a uniform, or Gumbel noise over verifier ids when
    `coupled`). ``q`` is a `SparseQ` of width `q_width` where the drafter has one, else
    dense f32[B, V].

    `exclude` (i32[B, j] verifier ids; ids < 0 match nothing): a draw without replacement
    after its twins' (`draft_group`) — the drafter's law at its temperature and filters
    over the ids left (their logits kept, the excluded ones masked like ids outside rule 3's
    intersection: at τ > 0 the rest renormalised, at τ 0 the best id left), or its own law
    in a row where nothing is left. ``q`` is the law drawn from, so every rule sees what
    was sampled."""
    if data.identity and kind_of(spec.lm).point_mass:
        # A drafter whose law is a point mass at its logits' argmax (prompt lookup):
        # the draw is that token under every rule, temperature and filter, without
        # a softmax and an inverse-CDF pass over the whole vocabulary.
        x = argmax_first(logits)
        return x, x, point_mass(x, v_vocab)
    if data.identity and data.support is not None:
        # Drawn over the head's K ids, where all the mass is (`feature_maps`): the law
        # of the draw and its q are those of the K probabilities.
        q_k = sampling_probs(
            jnp.take(logits, data.support, axis=-1),
            data.temperature,
            top_k=spec.top_k,
            top_p=spec.top_p,
            mask=_left(None, data.support, exclude),
        )
        if coupled:  # the verifier-id noise at the K ids (q is 0 elsewhere)
            x = data.support[gumbel_argmax(q_k, jnp.take(z, data.support, axis=-1))]
        else:
            x = data.support[sample_rows_u(z, q_k)]
        return x, x, on_ids(q_k, data.support, v_vocab)
    q_d = sampling_probs(
        logits,
        data.temperature,
        top_k=spec.top_k,
        top_p=spec.top_p,
        mask=_left(
            None if data.identity else data.to_verifier >= 0,
            jnp.arange(logits.shape[-1]) if data.identity else data.to_verifier,
            exclude,
        ),
    )
    if data.identity:
        x = gumbel_argmax(q_d, z) if coupled else sample_rows_u(z, q_d)
        return x, x, q_d
    if data.injective:  # one-to-one into verifier ids: q is q_d on them
        if coupled:  # unmapped ids have q_d = 0, whatever noise they read
            x_d = gumbel_argmax(q_d, jnp.take(z, jnp.maximum(data.to_verifier, 0), axis=-1))
        else:
            x_d = sample_rows_u(z, q_d)
        return data.to_verifier[x_d], x_d, on_ids(q_d, data.to_verifier, v_vocab)
    q_v = to_verifier_space(q_d, data.to_verifier, v_vocab)
    if coupled:
        # The shared Gumbel noise is indexed by verifier ids (drafter-invariant
        # coupling), so the draw is made there.
        x = gumbel_argmax(q_v, z)
        return x, data.from_verifier[x], q_v
    # By inverse CDF over the drafter's own ids: P(x_d = i) = q_d(i), so its verifier
    # id has law q_v (ids sharing one verifier id add up, as in to_verifier_space), and
    # the draw's work is over the drafter's vocabulary, not the verifier's.
    x_d = sample_rows_u(z, q_d)
    return data.to_verifier[x_d], x_d, q_v


def _left(mask, ids, exclude):
    """The draw ids a law may use: `mask` (bool[N] or None: all) without those whose
    verifier id (`ids` i32[N]) is in `exclude` i32[B, j] — bool[B, N], or `mask` where
    `exclude` is None or a row would have no id left."""
    if exclude is None:
        return mask
    base = jnp.ones(ids.shape, bool) if mask is None else mask
    left = base[None, :] & ~jnp.any(ids[None, :, None] == exclude[:, None, :], axis=-1)
    return jnp.where(jnp.any(left, axis=-1, keepdims=True), left, base[None, :])


def draft_chain(
    cfg: EngineConfig,
    spec: DrafterStatic,
    data: DrafterData,
    cache,
    logits,
    u,
    gumbel,
    v_vocab: int,
    first=None,
):
    """γ_k drafts of one drafter: (drafts i32[B,γ_k] verifier ids, q f32[B,γ_k,Vv], cache).

    `u`: f32[B, ≥γ_k] the uniforms of its draws (non-coupled rules; `_draft_uniforms`);
    `first`: the first draw already made (`draw`'s triple; twins drawn without
    replacement, `draft_group`), else it is drawn here from `logits`."""
    b = logits.shape[0]
    gamma = spec.own_gamma(cfg.gamma)
    coupled = registry.get(cfg.rule).coupled
    noise = gumbel[:, :gamma] if coupled else u[:, :gamma]  # draw j's: [B, γ_k(, V)]

    # γ − 1 forwards: x_1 comes from the logits the drafter already has, and x_γ is not fed
    # (if it is committed, next round's consume feeds it with the verifier's token).
    # Unrolled (γ is small and static): a rolled loop costs XLA:CPU copies of its state
    # (the drafter's cache) and a few thunks per trip.
    xs, qs = [], []
    for j in range(gamma):
        if j == 0 and first is not None:
            x, x_d, q_v = first
        else:
            x, x_d, q_v = draw(coupled, spec, data, v_vocab, logits, noise[:, j])
        xs.append(x)
        qs.append(q_v)
        if j < gamma - 1:
            new_logits, cache = spec.lm.forward(
                data.params, cache, x_d[:, None], cache.length[:, None], causal_block_mask(b, 1)
            )
            cache = spec.lm.advance(cache, jnp.ones((b,), jnp.int32))
            logits = new_logits[:, 0]
    return jnp.stack(xs, 1), _stack(qs, 1), cache


def _stack(trees, axis=0):
    return jax.tree_util.tree_map(lambda *a: jnp.stack(a, axis), *trees)


def q_width(spec: DrafterStatic, data: DrafterData) -> int | None:
    """How many verifier ids a drafter's law can put mass on, where it is known before
    drafting (its `SparseQ` width): 1 for a point mass (prompt lookup), K for a head over K
    ids (`DrafterData.support`) or a vocabulary mapped one-to-one into the verifier's
    (`DrafterData.injective`); None where it is the verifier's whole vocabulary or the map
    merges ids."""
    if data.identity and kind_of(spec.lm).point_mass:
        return 1
    if data.identity:
        return None if data.support is None else data.support.shape[0]
    return data.to_verifier.shape[0] if data.injective else None


def call_q_width(cfg: EngineConfig, drafters, d_data, v_vocab: int) -> int | None:
    """The width every chain's q is held at in a call: under ``q_layout='sparse'`` the
    widest drafter's, or None (dense f32[.., V]): the 'dense' layout, a drafter whose law
    is not sparse, or a width not below V."""
    if cfg.q_layout != 'sparse':
        return None
    widths = [q_width(spec, data) for spec, data in zip(drafters, d_data)]
    if any(w is None for w in widths) or max(widths) >= v_vocab:
        return None
    return max(widths)


def _pad_steps(q, pad: int):
    """q of a chain of γ_k draws padded with `pad` all-zero rows (a shorter chain)."""
    if pad == 0:
        return q
    if isinstance(q, SparseQ):
        cfg = ((0, 0), (0, pad), (0, 0))
        return q.replace(
            ids=jnp.pad(q.ids, cfg, constant_values=q.vocab), vals=jnp.pad(q.vals, cfg)
        )
    return jnp.pad(q, ((0, 0), (0, pad), (0, 0)))


class Drafted(NamedTuple):
    """What step 1 of a round leaves, per drafter (K of each), its drafts padded to the
    block's γ: drafts i32[B, K, γ] and their q f32[B, K, γ, Vv] (verifier ids; a `SparseQ`
    of the call's width `call_q_width` where every drafter's law is sparse), each
    drafter's cache after drafting, its length before drafting (`base_len`), its logits
    after the committed tokens it consumed, and where its consumption stopped (`synced`,
    `caught_up`)."""

    drafts: jax.Array
    qs: jax.Array
    dcaches: list
    base_len: list
    dlogits: list
    synced: list
    caught_up: list


def draft_all(
    cfg: EngineConfig,
    drafters,
    d_data,
    state: DecodeState,
    gammas,
    u_draft,
    gumbel,
    v_vocab: int,
    slots,
) -> Drafted:
    """Step 1: every drafter consumes the committed tokens new to it, then drafts γ_k
    (twins, `DrafterStatic.shares`, in one pass: `draft_group`)."""
    # A lone drafter always proposed the committed path, so at most two committed tokens
    # are new to it (x_γ and the bonus); otherwise up to γ + 1.
    gamma = max(gammas)
    # A feature drafter keeps none of its drafts (they read its own features, and the
    # verifier's are known once it has scored them), so it re-reads up to γ + 1.
    lone = len(drafters) == 1 and cfg.n_slots == 1 and not reads_features(drafters[0])
    width = 2 if lone else gamma + 1

    out = [None] * len(drafters)
    for group in draft_groups(drafters):
        res = draft_group(
            cfg, group, drafters, d_data, state, u_draft, gumbel, v_vocab, slots, width
        )
        for k, r in zip(group, res):
            out[k] = r
    width = call_q_width(cfg, drafters, d_data, v_vocab)
    drafts, qs, dcaches, base_len, dlogits, synced_all, caught_all = [], [], [], [], [], [], []
    for k, (x, q, cache, base, logits, synced, caught_up) in enumerate(out):
        base_len.append(base)
        synced_all.append(synced)
        caught_all.append(caught_up)
        dlogits.append(logits)
        check_q(q, f'drafter {k} q', allow_zero_rows=False)
        q = q_dense(q) if width is None else widen(q, width)
        pad = gamma - gammas[k]  # a shorter chain: padded, cut below
        drafts.append(jnp.pad(x, ((0, 0), (0, pad))))
        qs.append(_pad_steps(q, pad))
        dcaches.append(cache)
    return Drafted(
        drafts=jnp.stack(drafts, 1),
        qs=_stack(qs, 1),
        dcaches=dcaches,
        base_len=base_len,
        dlogits=dlogits,
        synced=synced_all,
        caught_up=caught_all,
    )


def draft_group(
    cfg: EngineConfig, group, drafters, d_data, state, u_draft, gumbel, v_vocab: int, slots, width
) -> list[tuple]:
    """Step 1 for one group of twins (a lone drafter is a group of one): per member, (drafts,
    q, cache after drafting, its length before, logits after consuming, synced, caught_up).

    Twins consume and draft in one `vmap` over the members (each weight read once for all of
    them), each with its own cache, logits, uniforms and temperature. Under `token_tree`
    their first drafts are drawn without replacement (Jeon et al. 2024, recursive rejection
    sampling without replacement): member j's from its law with the first drafts of the
    members tried before it in the row's slots removed (`draw`'s `exclude`), so siblings at
    the root do not repeat a token the rule has already rejected. The condition that keeps
    the rule exact — a candidate's law depends only on candidates tried before it — holds
    row by row: a member placed ahead of an earlier-drawn twin in a row's slots excludes
    nothing there. Later drafts are fresh draws along each member's own chain.
    """
    lead = group[0]
    spec, data = drafters[lead], d_data[lead]

    if len(group) == 1:
        cache, logits, synced, caught_up = consume(
            spec,
            data,
            state.dcaches[lead],
            state.dlogits[lead],
            state.tokens,
            state.dsynced[lead],
            state.length,
            width,
        )
        u = None if u_draft is None else u_draft[:, lead]
        x, q, dcache = draft_chain(cfg, spec, data, cache, logits, u, gumbel, v_vocab)
        return [(x, q, dcache, cache.length, logits, synced, caught_up)]

    temps = jnp.stack([jnp.asarray(d_data[j].temperature, jnp.float32) for j in group])
    u = None if u_draft is None else jnp.stack([u_draft[:, j] for j in group])  # [M, B, γ]

    def member_consume(cache, logits, synced, t):
        d = data.replace(temperature=t)
        return consume(spec, d, cache, logits, state.tokens, synced, state.length, width)

    cache, logits, synced, caught_up = jax.vmap(member_consume)(
        _stack([state.dcaches[j] for j in group]),
        jnp.stack([state.dlogits[j] for j in group]),
        jnp.stack([state.dsynced[j] for j in group]),
        temps,
    )
    first = None
    if registry.get(cfg.rule).twins_without_replacement and not kind_of(spec.lm).point_mass:
        # A member's place in each row's slots (S where the row does not verify it).
        n_s = slots.shape[1]
        place = [
            jnp.min(jnp.where(slots == j, jnp.arange(n_s)[None, :], n_s), axis=1) for j in group
        ]
        firsts = []
        for i in range(len(group)):
            exclude = None
            if i:  # earlier members tried before this one in the row; -1 matches no id
                before = jnp.stack([place[h] < place[i] for h in range(i)], 1)  # [B, i]
                exclude = jnp.where(before, jnp.stack([f[0] for f in firsts], 1), -1)
            d = data.replace(temperature=temps[i])
            firsts.append(draw(False, spec, d, v_vocab, logits[i], u[i, :, 0], exclude))
        first = _stack(firsts)

    def member_draft(cache, logits, u, t, first):
        d = data.replace(temperature=t)
        return draft_chain(cfg, spec, d, cache, logits, u, gumbel, v_vocab, first=first)

    x, q, dcache = jax.vmap(member_draft)(cache, logits, u, temps, first)
    return [
        jax.tree_util.tree_map(
            lambda a, i=i: a[i], (x, q, dcache, cache.length, logits, synced, caught_up)
        )
        for i in range(len(group))
    ]


def draft_groups(drafters: Sequence[DrafterStatic]) -> list[list[int]]:
    """The drafters' indices grouped by `DrafterStatic.shares`, each group's first index
    the drafter the others share (a drafter named once is a group of one)."""
    groups: dict[int, list[int]] = {}
    for k, d in enumerate(drafters):
        groups.setdefault(k if d.shares is None else d.shares, []).append(k)
    return list(groups.values())


def draft_uniforms(row_keys, length, n_drafters: int, gamma: int) -> jax.Array:
    """f32[B, K, γ]: the uniform of drafter k's draw j, `uniform(fold_in(row key,
    STREAM_DRAFT, length, k, j))` — every draw of the round in one computation."""
    k = jnp.arange(n_drafters)[None, :, None]
    j = jnp.arange(gamma)[None, None, :]
    kd = fold_data(row_keys[:, None, None, :], STREAM_DRAFT, length[:, None, None], k, j)
    return uniform_data(kd)
