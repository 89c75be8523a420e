"""Every drafter scored teacher forced on a text the verifier committed: what `auto`'s
scores without exploration read after each routed step (`policy.plan.run_plans`,
`AutoRouter(score='teacher_forced')`) and what `measure.routing_room` measures the room with.

One verifier pass and one pass per drafter over each row, each drafter reading the row as the
engine does, its law the one the engine draws from (`engine.drafting.draw`).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax.engine.deployment import Deployment
from specjax.engine.drafting import draw
from specjax.engine.features import feature_layout, pick_features
from specjax.engine.programs import run_program
from specjax.models.api import causal_block_mask, forward_rows
from specjax.verify.qlaw import q_dense

__all__ = ["teacher_forced", "verifier_window"]


def _width(n: int, bucket: int) -> int:
    return max(bucket, -(-int(n) // bucket) * bucket)


@functools.partial(jax.jit, static_argnames=("verifier", "request"))
def _verifier_pass(verifier, v_params, tokens, n, request):
    """Logits f32[B, T, V] at every position of tokens[:, :n] (and the hidden states the
    feature drafters read, `feature_layout`'s request, else None)."""
    b, t = tokens.shape
    cache = verifier.init_cache(b, t).replace(length=jnp.minimum(n, 0).astype(jnp.int32))
    at = jnp.broadcast_to(jnp.arange(t), (b, t))
    out = forward_rows(
        verifier, v_params, cache, tokens, at, causal_block_mask(b, t), at, with_hidden=request
    )
    return out[0], (out[1] if request else None)


@functools.partial(jax.jit, static_argnames=("spec", "v_vocab"))
def _drafter_scores(spec, data, v_logits, v_next, ids, ends, n, feats, feat_n, v_vocab):
    """α, accept and argmax agreement f32[B, T] of one drafter against the verifier's
    logits ``v_logits`` at every verifier position, the drafter reading ``ids`` (its
    re-spelling of the text, ``n`` pieces) and its law taken after each verifier token's
    last piece (``ends``)."""
    b, w = ids.shape
    t = ends.shape[1]
    cache = spec.lm.init_cache(b, w).replace(length=jnp.minimum(n, 0).astype(jnp.int32))
    if feats is not None:  # as the engine's prefill: the verifier's features first
        cache = spec.lm.write_features(cache, feats, jnp.zeros_like(n), feat_n)
    pos = jnp.broadcast_to(jnp.arange(w), (b, w))
    logits, _ = forward_rows(spec.lm, data.params, cache, ids, pos, causal_block_mask(b, w), ends)
    flat = logits.reshape(b * t, logits.shape[-1])
    _, _, q = draw(False, spec, data, v_vocab, flat, jnp.zeros((b * t,), jnp.float32))
    q = q_dense(q).reshape(b, t, v_vocab)
    p = jax.nn.softmax(v_logits.astype(jnp.float32), -1)
    alpha = jnp.minimum(p, q).sum(-1)
    px = jnp.take_along_axis(p, v_next[..., None], -1)[..., 0]
    qx = jnp.take_along_axis(q, v_next[..., None], -1)[..., 0]
    accept = jnp.where(px > 0, jnp.minimum(1.0, qx / jnp.maximum(px, 1e-30)), 0.0)
    top1 = jnp.argmax(q, -1) == jnp.argmax(v_logits, -1)
    return alpha, accept, top1


@functools.partial(jax.jit, static_argnames=("verifier", "request"))
def _window_pass(v_params, vcache, idx, tokens, lo, *, verifier, request=False):
    """The verifier's law at τ 1, f32[B, W, V], at positions lo[b] + [0, W) of the carried
    cache's rows ``idx``, reading ``tokens`` there, with the cache's committed slots before
    lo[b] as context (rolled back to lo[b]: `models.cache`, the carried cache itself
    untouched); bool[B] whether every row's slots before lo[b] were committed; and the
    hidden states feature drafters read there (`feature_layout`'s ``request``; else None).
    The law once here, not once per drafter scored against it."""
    cache = jax.tree.map(lambda x: jnp.take(x, idx, axis=0), vcache)
    ok = lo <= cache.length
    cache = cache.replace(length=lo)
    b, w = tokens.shape
    pos = lo[:, None] + jnp.arange(w)[None, :]
    at = jnp.broadcast_to(jnp.arange(w), (b, w))
    mask = causal_block_mask(b, w)
    out = forward_rows(verifier, v_params, cache, tokens, pos, mask, at, with_hidden=request)
    return jax.nn.softmax(out[0].astype(jnp.float32), -1), ok, (out[1] if request else None)


def _score_one(dep, spec, data, v_logits, nxt, ids, ends, dn, feats, feat_n):
    """`_drafter_scores` of one drafter of ``dep`` at its own temperature."""
    return _drafter_scores(
        dataclasses.replace(spec.static, gamma=None),
        data.replace(temperature=jnp.float32(spec.temperature)),
        v_logits,
        jnp.asarray(nxt),
        jnp.asarray(ids),
        jnp.asarray(np.asarray(ends, np.int32)),
        jnp.asarray(dn),
        feats,
        feat_n,
        dep.verifier.vocab_size,
    )


def _respell(data, rows: list, width: int, bucket: int, cap: int):
    """(ids i32[B, W_d], ends i32[B, width], n i32[B], first i32[B]): each row's verifier
    ids re-spelt in the drafter's ids, concatenated; ends[b, t] the index of token t's last
    piece. A re-spelling longer than the drafter's context ``cap`` keeps its most recent
    whole tokens that fit (tokens before ``first[b]`` are not read: their ends are 0). W_d
    is a multiple of ``bucket`` (pass the row width: a text growing inside a fixed width
    keeps one W_d while its re-spelling fits, a few otherwise), at most ``cap``."""
    retok, lens = np.asarray(data.retok), np.asarray(data.retok_len)
    out = []
    for r in rows:
        k = lens[np.asarray(r, np.int64)] if r else np.zeros((0,), np.int64)
        start = np.cumsum(k) - k  # first piece of each token
        first = int(np.searchsorted(start, max(int(k.sum()) - cap, 0), side="left"))
        flat = [retok[t, : lens[t]] for t in r[first:]]
        flat = np.concatenate(flat) if flat else np.zeros((0,), np.int32)
        out.append((flat, np.cumsum(k[first:]) - 1, first))
    w_d = min(_width(max(len(f) for f, _, _ in out), bucket), max(cap, 1))
    ids = np.zeros((len(rows), w_d), np.int32)
    ends = np.zeros((len(rows), width), np.int32)
    n = np.zeros((len(rows),), np.int32)
    first = np.zeros((len(rows),), np.int32)
    for i, (f, e, f0) in enumerate(out):
        ids[i, : len(f)] = f
        ends[i, f0 : f0 + len(e)] = e
        n[i], first[i] = len(f), f0
    return ids, ends, n, first


def teacher_forced(
    dep: Deployment, rows: Sequence[Sequence[int]], width: int | None = None, bucket: int = 32
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """Every drafter of ``dep`` scored teacher forced at every position of each row (its
    verifier ids; position t predicts token t + 1): (α f32[K, B, W] = Σ_x min(p, q) with p
    the verifier's law at τ 1, accept f32[K, B, W] = min(1, q(x) / p(x)) of the row's next
    token x, top1 bool[K, B, W] = argmax agreement, seconds). W = ``width`` (≥ the longest
    row; default the longest rounded up to ``bucket``), a drafter's re-spelling rounded up
    to ``bucket`` pieces, or with a given width to a multiple of it (capped at the drafter's
    context): a fixed width and row count give one program per drafter (a few for a drafter
    of another tokenizer, whose re-spelling may outgrow the width).

    One verifier pass and one pass per drafter over each row, each drafter reading the row
    as the engine does (its re-spelling of the verifier's tokens; a feature drafter the
    verifier's features, written first as in the engine's prefill), its law the one the
    engine draws from at its temperature and filters (`engine.drafting.draw`). A drafter
    whose context cannot hold a row's re-spelling reads its most recent whole tokens that
    fit; positions before them score 0 (a prompt's start, never a recent step's)."""
    rows = [list(map(int, r)) for r in rows]
    longest = max(len(r) for r in rows)
    fixed = width is not None
    width = _width(longest, bucket) if width is None else int(width)
    if width < longest:
        raise ValueError(f"teacher_forced: width {width} < the longest row ({longest})")
    t0 = time.perf_counter()
    tok = np.zeros((len(rows), width), np.int32)
    nxt = np.zeros((len(rows), width), np.int32)
    for i, r in enumerate(rows):
        tok[i, : len(r)] = r
        nxt[i, : max(len(r) - 1, 0)] = r[1:]
    n = np.asarray([len(r) for r in rows], np.int32)
    request, picks = feature_layout(dep.verifier, [d.lm for d in dep.drafters])
    v_logits, hidden = _verifier_pass(
        dep.verifier, dep.v_params, jnp.asarray(tok), jnp.asarray(n), request
    )
    outs, starts = [], []
    for j, (spec, data) in enumerate(zip(dep.drafters, dep.d_data)):
        ids, ends, dn, first = _respell(
            data, rows, width, width if fixed else bucket, spec.lm.max_len
        )
        if (first > 0).any() and picks[j] is not None:
            raise ValueError(
                f"teacher_forced: feature drafter {spec.name!r} cannot read rows longer "
                f"than its context ({spec.lm.max_len})"
            )
        starts.append(first)
        feats = feat_n = None
        if picks[j] is not None:
            feats = pick_features(hidden, picks[j], request)
            feat_n = jnp.asarray(np.maximum(n - 1, 0))
        outs.append(_score_one(dep, spec, data, v_logits, nxt, ids, ends, dn, feats, feat_n))
    outs = jax.device_get(outs)
    alpha = np.stack([np.asarray(o[0]) for o in outs])
    accept = np.stack([np.asarray(o[1]) for o in outs])
    top1 = np.stack([np.asarray(o[2]) for o in outs])
    unread = np.arange(width)[None, None, :] < np.stack(starts)[:, :, None]  # [K, B, W]
    alpha[unread], accept[unread], top1[unread] = 0.0, 0.0, False
    return alpha, accept, top1, time.perf_counter() - t0


def verifier_window(
    dep: Deployment,
    vcache,
    cap: int,
    plans: Sequence[int],
    rows: Sequence[Sequence[int]],
    new: Sequence[int],
    window: int,
) -> tuple[jax.Array, np.ndarray, float]:
    """The verifier's law at τ 1, f32[B, window, V], over each row's last step, continuing
    the plan runner's carried cache (``vcache``, capacity ``cap``; row ``plans[b]`` holds
    ``rows[b]`` committed) instead of reading the whole text again: the block starts at
    position lo[b] (the step's first predicting position, earlier where the block would
    leave the cache), one program per run, like a verify call of ``window`` tokens.
    Returns (law, lo i64[B], seconds of the program, the hidden states [B, window, F]
    there that the deployment's feature drafters read, `feature_layout`, or None). The
    drafters' side is `policy.carried_scores.ScoreReads`."""
    rows = [list(map(int, r)) for r in rows]
    n = np.asarray([len(r) for r in rows], np.int64)
    new = np.asarray(new, np.int64)
    if (new + 1 > window).any() or (new + 1 > n).any():
        raise ValueError(f"verifier_window: steps of {new.tolist()} tokens, window {window}")
    lo = np.minimum(n - new - 1, cap - window)  # the block stays inside the cache
    tok = np.zeros((len(rows), window), np.int32)
    for i, r in enumerate(rows):
        seg = r[lo[i] : lo[i] + window]
        tok[i, : len(seg)] = seg
    args = (
        dep.v_params,
        vcache,
        jnp.asarray(plans, jnp.int32),
        jnp.asarray(tok),
        jnp.asarray(lo, jnp.int32),
    )
    request, _ = feature_layout(dep.verifier, [d.lm for d in dep.drafters])
    statics = {"verifier": dep.verifier, "request": request}
    (law, ok, hidden), secs = run_program(_window_pass, statics, args)
    if not np.all(jax.device_get(ok)):
        raise ValueError("verifier_window: a row's carried cache is behind its text")
    return law, lo, secs, hidden
