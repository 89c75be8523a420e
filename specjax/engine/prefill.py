"""Prompts into caches: padding, the context check and the (ragged) prefill.

`pad_prompts` right-pads token lists to a bucketed width. `prefill_cache` runs one
forward over the prompts into a fresh cache of the call's capacity; for batches of ≥ 8
rows it is ragged: rows sorted by length are prefilled in up to 4 groups, each at its own
width (`prefill_groups`, a static layout), instead of every row at the longest prompt's,
and the cache comes back in the rows' own order. `prefill` is the same as its own compiled
program, for callers that build engine state piece by piece (plan steps, benchmarks).
`prompt_state` is the carried state a call from prompts starts from (every cache prefilled
at the call's `CallShapes`), in the speculative programs and continuous batching's refill.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax.engine.features import feature_layout, pick_features
from specjax.engine.programs import run_program
from specjax.engine.state import EngineState
from specjax.errors import ConfigError
from specjax.models.api import causal_block_mask, forward_rows

__all__ = [
    'CallShapes',
    'pad_prompts',
    'check_context',
    'prefill_groups',
    'prefill_cache',
    'prefill',
    'prompt_state',
]


@dataclasses.dataclass(frozen=True)
class CallShapes:
    """The fixed shapes of a call that starts from prompts (static: one compiled program
    per distinct value).

    Attributes:
      buf_len: the token buffer's length per row (prompt width, the new tokens, `reserve`
        and one block).
      v_cap / d_caps: the verifier's and each drafter's cache capacity.
      v_groups / d_groups: the verifier's and each drafter's ragged prefill layout
        (`prefill_groups`; None or empty: one padded block).
    """

    buf_len: int
    v_cap: int
    d_caps: tuple = ()
    v_groups: Any = None
    d_groups: tuple = ()


def pad_prompts(
    prompts: Sequence[Sequence[int]], field: str = "prompt", bucket: int = 1, min_width: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Right-pads token lists into (i32[B, P], lengths i32[B]); empty prompts are errors.

    P is at least `min_width` and rounded up to a multiple of `bucket`, so that growing
    prompts (plan steps) reuse one compiled program instead of retracing per length.
    """
    if not prompts:
        raise ConfigError(f"{field}: got an empty batch; allowed: ≥ 1 prompt")
    lens = np.array([len(p) for p in prompts], np.int32)
    if (lens < 1).any():
        raise ConfigError(f"{field}: row {int(np.argmin(lens))} is empty; allowed: ≥ 1 token")
    width = -(-max(int(lens.max()), int(min_width)) // bucket) * bucket
    out = np.zeros((len(prompts), width), np.int32)
    for i, p in enumerate(prompts):
        out[i, : len(p)] = p
    return out, lens


def check_context(name: str, lm, need: int) -> None:
    """ConfigError unless `lm` (named `name` in the message) holds `need` positions."""
    if need > lm.max_len:
        raise ConfigError(
            f"{name} context: this batch needs {need} positions (prompt + "
            f"max_new_tokens + block); allowed: ≤ max_len = {lm.max_len}"
        )


# Ragged prefill: rows sorted by length, prefilled in a few groups at their own widths.
PREFILL_GROUPS = 4  # at most this many groups of rows (each a forward of its own shape)
PREFILL_MIN_ROWS = 8  # smaller batches prefill as one padded block
PREFILL_QUANTUM = 16  # group widths are multiples of max(bucket, this)
PREFILL_MIN_SAVING = 0.25  # group only when it skips at least this share of the padded block


def prefill_groups(cached, width: int, bucket: int = 1) -> tuple[tuple[int, int], ...] | None:
    """The static layout of a ragged prefill, or None for one padded block.

    Rows are taken in stable order of `cached` (the tokens each row caches), split into
    `PREFILL_GROUPS` near-equal runs, and each run is prefilled at its own width: its longest
    row rounded up to a multiple of max(`bucket`, `PREFILL_QUANTUM`), at most `width` (the
    padded prompt width). Adjacent runs of one width merge. The benchmark's 32 zoo prompts
    (18–83 tokens, padded to 128) prefill 2,560 positions instead of 4,096 at bucket 64, and
    1,792 at bucket 16. The layout is a compile-time constant, so the equal-size runs and the
    quantum bound how many programs ragged batches compile. Returns ((rows, width), ...) in
    sorted order, or None when the batch is small or the groups would skip less than
    `PREFILL_MIN_SAVING` of the block.
    """
    n = np.asarray(cached, np.int64).reshape(-1)
    b = n.shape[0]
    if b < PREFILL_MIN_ROWS or PREFILL_GROUPS < 2:
        return None
    q = max(int(bucket), PREFILL_QUANTUM)
    srt = np.sort(n, kind='stable')
    g = min(PREFILL_GROUPS, b)
    sizes = [b // g + (i < b % g) for i in range(g)]
    groups: list[list[int]] = []
    r0 = 0
    for rows in sizes:
        longest = int(srt[r0 + rows - 1])
        w = int(min(width, max(q, -(-longest // q) * q)))
        if groups and groups[-1][1] == w:
            groups[-1][0] += rows
        else:
            groups.append([rows, w])
        r0 += rows
    if sum(r * w for r, w in groups) > (1.0 - PREFILL_MIN_SAVING) * b * width:
        return None
    return tuple((int(r), int(w)) for r, w in groups)


def prefill_cache(lm, params, tokens, n, capacity, groups=None, with_hidden=False, features=None):
    """Caches tokens[:, :n] (n i32[B] ≤ P); returns (cache, logits after token n−1).

    `groups` (static, from `prefill_groups` on the same `n`): prefill the rows in stable
    order of `n`, each group at its own width, and return the cache in the rows' own order
    (a cache's leaves are batch-major). Without it, one forward over the padded block.

    `with_hidden`: also return the model's hidden states [B, P, D] (`forward_hidden`; a
    verifier whose features a feature drafter reads; a tuple: those states, [B, P, n·D],
    `features.feature_layout`). `features`: (hidden [B, P', D],
    count i32[B]) — the verifier's features written into a feature drafter's fresh cache
    (`specjax.models.eagle.EagleLM.write_features`) before its prompt is fed.
    """
    if groups:
        if sum(r for r, _ in groups) != tokens.shape[0]:
            raise ValueError(f"prefill groups {groups} do not cover {tokens.shape[0]} rows")
        order = jnp.argsort(n, stable=True)
        parts, lasts, hids = [], [], []
        r0 = 0
        for rows, width in groups:
            idx = order[r0 : r0 + rows]
            feats = None
            if features is not None:
                feats = (jnp.take(features[0], idx, axis=0), jnp.take(features[1], idx))
            out = prefill_cache(
                lm,
                params,
                jnp.take(tokens, idx, axis=0)[:, :width],
                jnp.take(n, idx),
                capacity,
                with_hidden=with_hidden,
                features=feats,
            )
            parts.append(out[0])
            lasts.append(out[1])
            if with_hidden:
                h = out[2]
                hids.append(jnp.pad(h, ((0, 0), (0, tokens.shape[1] - h.shape[1]), (0, 0))))
            r0 += rows
        inverse = jnp.argsort(order)
        back = lambda *xs: jnp.take(jnp.concatenate(xs, 0), inverse, axis=0)  # noqa: E731
        cache = jax.tree.map(back, *parts)
        if with_hidden:
            return cache, back(*lasts), back(*hids)
        return cache, back(*lasts)
    b, p = tokens.shape
    # A fresh cache's length is a compile-time 0, and XLA then constant-folds the masked
    # attention over every empty slot (tens of seconds of compilation at batch 12). Tie it
    # to a runtime value that is 0.
    cache = lm.init_cache(b, capacity).replace(length=jnp.minimum(n, 0).astype(jnp.int32))
    if features is not None:
        cache = lm.write_features(cache, features[0], jnp.zeros_like(n), features[1])
    args = (params, cache, tokens, jnp.broadcast_to(jnp.arange(p), (b, p)), causal_block_mask(b, p))
    # Only the last cached token's logits are read: the head runs on that row alone, not on
    # every prompt position (docs/performance.md: a batch-8 speculative call's prefills
    # 440 -> 390 ms with SmolLM2 and its feature drafter).
    at = jnp.maximum(n - 1, 0).astype(jnp.int32)[:, None]
    out = forward_rows(lm, *args, at, with_hidden=with_hidden)
    if with_hidden:
        return lm.advance(out[2], n), out[0][:, 0], out[1]
    return lm.advance(out[1], n), out[0][:, 0]


@functools.partial(jax.jit, static_argnames=("lm", "capacity", "groups", "with_hidden"))
def _prefill_program(params, tokens, n, features=None, *, lm, capacity, groups, with_hidden=False):
    return prefill_cache(
        lm, params, tokens, n, capacity, groups, with_hidden=with_hidden, features=features
    )


def prefill(
    lm,
    params,
    prompts: Sequence[Sequence[int]],
    *,
    capacity: int,
    width: int = 0,
    cached: Sequence[int] | None = None,
    bucket: int = 1,
    features=None,
    with_hidden=False,
):
    """A fresh cache of `capacity` slots per row holding each prompt: one compiled program.

    Args:
      lm / params: the model (verifier or drafter) and its parameters.
      prompts: B token lists, padded to a multiple of `bucket` ≥ `width`.
      cached: tokens of each prompt to cache (default all; the engine's verifier caches all
        but the last, which is the next round's root).
      features: a feature drafter's (the verifier's features [B, W, F], count i32[B]),
        written into its fresh cache before its prompt is fed (`prefill_cache`).
      with_hidden: a verifier's: also return its hidden states over the prompts
        [B, P, ·] (`prefill_cache`; what its feature drafters read, `feature_layout`).

    Returns:
      (cache, logits f32[B, V] after the last cached token, seconds of the program), on
      the device: the pieces of an `EngineState` that later calls continue; with
      ``with_hidden`` the hidden states last.
    """
    arr, plen = pad_prompts(prompts, bucket=bucket, min_width=width)
    n = plen if cached is None else np.asarray(cached, np.int32)
    check_context(getattr(lm, "name", "model"), lm, int(arr.shape[1]))
    if int(capacity) < int(n.max()):
        raise ConfigError(
            f"prefill capacity: got {capacity}; allowed: ≥ the longest cached "
            f"prompt ({int(n.max())} tokens)"
        )
    dev = jax.device_put(dict(tokens=arr, n=n))
    statics = dict(
        lm=lm, capacity=int(capacity), groups=prefill_groups(n, int(arr.shape[1]), bucket)
    )
    if with_hidden:
        statics['with_hidden'] = with_hidden
    args = (params, dev['tokens'], dev['n'])
    out, seconds = run_program(
        _prefill_program, statics, args if features is None else args + (tuple(features),)
    )
    return out[0], out[1], seconds, *out[2:]


def prompt_state(
    verifier,
    v_params,
    prompt,
    prompt_len,
    shapes: CallShapes,
    *,
    drafter_lms=(),
    d_params=(),
    d_prompts=(),
    d_prompt_len=(),
) -> EngineState:
    """The state of a call from prompts (traced inside its program): the verifier's cache
    holding each prompt but its last token (the first round's root) and every drafter's its
    own prompt (a feature drafter's written the verifier's features of its prompt first),
    the prompts in a token buffer of `shapes.buf_len`, every drafter synced to the prompt.

    Args:
      prompt / prompt_len: i32[B, P] the verifier's padded prompts and i32[B] their lengths.
      drafter_lms / d_params / d_prompts / d_prompt_len: per drafter its LM, parameters and
        padded prompts i32[B, P_k] with lengths i32[B] (none: a verifier-only state).
    """
    b = prompt.shape[0]
    features, picks = feature_layout(verifier, drafter_lms)
    n = prompt_len - 1
    vout = prefill_cache(verifier, v_params, prompt, n, shapes.v_cap, shapes.v_groups, features)
    dcaches, dlogits = [], []
    d_groups = shapes.d_groups or (None,) * len(drafter_lms)
    for lm, params, dp, dl, cap, grp, pick in zip(
        drafter_lms, d_params, d_prompts, d_prompt_len, shapes.d_caps, d_groups, picks
    ):
        # A feature drafter reads the verifier's features of its prompt (all but the last
        # token's: that one is the first round's root).
        feats = None
        if pick is not None:
            feats = (pick_features(vout[2], pick, features), prompt_len - 1)
        c, lg = prefill_cache(lm, params, dp, dl, cap, grp, features=feats)
        dcaches.append(c)
        dlogits.append(lg)
    tokens = jnp.zeros((b, shapes.buf_len), jnp.int32).at[:, : prompt.shape[1]].set(prompt)
    return EngineState(
        tokens=tokens,
        length=prompt_len,
        vcache=vout[0],
        dcaches=tuple(dcaches),
        dsynced=jnp.broadcast_to(prompt_len, (len(drafter_lms), b)),
        dlogits=tuple(dlogits),
    )
