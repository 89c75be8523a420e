"""Generation: prefill, the speculative loop and the autoregressive baseline, each jitted.

`speculative_generate` and `autoregressive_generate` are the entry points: they validate
their inputs on the host (before any work), build the padded prompt arrays once, and run
the whole generation in one jitted `lax.while_loop` (one host round-trip per call).
"""
from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np

from specjax.engine.decode import (Counters, DecodeState, _causal, _gumbel, _keys,
                                   _STREAM_VERIFY, speculative_round)
from specjax.engine.spec import (TRACED_TEMPERATURE, DrafterData, DrafterSpec, EngineConfig,
                                 validate_drafter)
from specjax.errors import ConfigError
from specjax.verify.distributions import gumbel_argmax, sample, sampling_probs


@dataclasses.dataclass
class GenerateResult:
    """Host-side result of one generate call.

    Attributes:
      tokens: i32[B, L] prompt + committed tokens (verifier ids).
      length: i32[B]; start: i32[B] prompt lengths; new tokens are tokens[b, start:length].
      counters: Counters as numpy arrays (None for the autoregressive baseline).
      seconds: wall-clock of the jitted call (after compilation when `warm`).
    """
    tokens: np.ndarray
    length: np.ndarray
    start: np.ndarray
    counters: Any
    seconds: float = float("nan")

    def new_tokens(self, row: int) -> list[int]:
        return self.tokens[row, self.start[row]:self.length[row]].tolist()


def pad_prompts(prompts: Sequence[Sequence[int]], field: str = "prompt",
                bucket: int = 1, min_width: int = 0) -> tuple[np.ndarray, np.ndarray]:
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
        out[i, :len(p)] = p
    return out, lens


def _check_context(name: str, lm, need: int) -> None:
    if need > lm.max_len:
        raise ConfigError(f"{name} context: this batch needs {need} positions (prompt + "
                          f"max_new_tokens + block); allowed: ≤ max_len = {lm.max_len}")


def _check_finite(name: str, params) -> None:
    leaves = [np.asarray(x) for x in jax.tree.leaves(params)
              if np.issubdtype(np.asarray(x).dtype, np.floating)]
    if not all(np.isfinite(x).all() for x in leaves):
        raise ConfigError(f"{name} parameters: contain NaN or inf; allowed: finite values")


def _prefill_lm(lm, params, tokens, n):
    """Caches tokens[:, :n] (n i32[B] ≤ P); returns (cache, logits after token n−1)."""
    b, p = tokens.shape
    # A fresh cache's length is a compile-time 0, and XLA then constant-folds the masked
    # attention over every empty slot (tens of seconds of compilation at batch 12). Tie it
    # to a runtime value that is 0.
    cache = lm.init_cache(b).replace(length=jnp.minimum(n, 0).astype(jnp.int32))
    logits, cache = lm.forward(params, cache, tokens, jnp.broadcast_to(jnp.arange(p), (b, p)),
                               _causal(b, p))
    last = jnp.take_along_axis(logits, jnp.maximum(n - 1, 0)[:, None, None], axis=1)[:, 0]
    return lm.advance(cache, n), last


@functools.partial(jax.jit, static_argnames=("cfg", "verifier", "drafters", "buf_len"))
def _run_speculative(cfg, verifier, drafters, v_params, d_data, slots, stop_table,
                     prompt, prompt_len, d_prompts, d_prompt_len, row_keys, buf_len):
    b = prompt.shape[0]
    vcache, _ = _prefill_lm(verifier, v_params, prompt, prompt_len - 1)
    dcaches, dlogits = [], []
    for spec, data, dp, dl in zip(drafters, d_data, d_prompts, d_prompt_len):
        c, lg = _prefill_lm(spec.lm, data.params, dp, dl)
        dcaches.append(c)
        dlogits.append(lg)
    tokens = jnp.zeros((b, buf_len), jnp.int32).at[:, :prompt.shape[1]].set(prompt)
    k = len(drafters)
    state = DecodeState(
        tokens=tokens, length=prompt_len, start=prompt_len, done=jnp.zeros((b,), bool),
        row_keys=row_keys, vcache=vcache, dcaches=tuple(dcaches),
        dsynced=jnp.broadcast_to(prompt_len, (k, b)), dlogits=tuple(dlogits),
        counters=Counters.zeros(b, k, cfg.gamma))
    body = functools.partial(speculative_round, cfg, verifier, drafters, v_params, d_data,
                             slots, stop_table)
    return jax.lax.while_loop(lambda s: ~jnp.all(s.done), body, state)


def speculative_generate(cfg: EngineConfig, verifier, v_params, drafters: Sequence[DrafterSpec],
                         d_data: Sequence[DrafterData], prompts: Sequence[Sequence[int]],
                         drafter_prompts: Sequence[Sequence[Sequence[int]]],
                         row_keys: jax.Array, slots: np.ndarray | None = None,
                         stop_table: np.ndarray | None = None,
                         bucket: int = 1, min_width: int = 0,
                         drafter_min_width: Sequence[int] | None = None) -> GenerateResult:
    """Speculative generation of `cfg.max_new_tokens` per row (or until a stop token).

    Args:
      cfg: the engine configuration (γ, rule, verifier temperature, slots, budget).
      verifier / v_params: the verifier's functional LM and parameters.
      drafters / d_data: K drafters (static specs) and their arrays.
      prompts: B verifier-token prompts. drafter_prompts[k]: the same texts in drafter k's
        own tokenisation (B lists).
      row_keys: u32[B, 2] key data, one per row (`jax.random.key_data`). Rows that share a
        key share their randomness (rule 'coupled' relies on it).
      slots: i32[B, S] drafter indices per row in priority order, -1 = empty; default
        every row uses drafters 0..S−1.
      stop_table: bool[Vv], tokens that end a row (e.g. those containing a newline).
      bucket: prompt widths are rounded up to a multiple of it (fewer compilations).
      min_width / drafter_min_width: the verifier's and each drafter's padded prompt width
        is at least this (a run whose prompts grow keeps one compiled program).

    Returns:
      GenerateResult.
    """
    k = len(drafters)
    if k < 1:
        raise ConfigError("drafters: got none; allowed: ≥ 1 drafter (use "
                          "autoregressive_generate for the verifier alone)")
    for d in drafters:
        validate_drafter(d)
    prompt, plen = pad_prompts(prompts, bucket=bucket, min_width=min_width)
    b = prompt.shape[0]
    if slots is None:
        if cfg.n_slots > k:
            raise ConfigError(f"n_slots: got {cfg.n_slots}; allowed: ≤ {k} drafters")
        slots = np.tile(np.arange(cfg.n_slots, dtype=np.int32), (b, 1))
    slots = np.asarray(slots, np.int32)
    if slots.shape != (b, cfg.n_slots) or (slots >= k).any() or (slots < -1).any():
        raise ConfigError(f"slots: got shape {slots.shape} with values in "
                          f"[{slots.min()}, {slots.max()}]; allowed: shape ({b}, {cfg.n_slots}) "
                          f"with drafter indices in [-1, {k - 1}]")
    if not (slots >= 0).any(axis=1).all():
        raise ConfigError("slots: a row has no drafter; allowed: ≥ 1 drafter per row")
    if len(drafter_prompts) != k or any(len(dp) != b for dp in drafter_prompts):
        raise ConfigError(f"drafter_prompts: need {k} lists of {b} prompts")
    gamma = cfg.gamma
    _check_context("verifier", verifier, prompt.shape[1] + cfg.max_new_tokens + cfg.n_slots * gamma)
    d_pad = []
    d_min = list(drafter_min_width) if drafter_min_width is not None else [0] * k
    for spec, data, dp, w in zip(drafters, d_data, drafter_prompts, d_min):
        arr, ln = pad_prompts(dp, field=f"drafter {spec.name!r} prompt", bucket=bucket,
                              min_width=w)
        m = int(np.asarray(data.retok).shape[1])
        # A drafter of another tokenizer may spell a verifier token in up to m of its own
        # tokens; the prompt plus one consume block must fit. Past that, its cache drops
        # writes (models/cache.py): its drafts degrade, the output stays exact (q is what
        # it sampled from).
        from specjax.engine.decode import consume_width  # pylint: disable=import-outside-toplevel
        _check_context(f"drafter {spec.name!r}", spec.lm,
                       arr.shape[1] + consume_width(m, gamma + 1) + gamma)
        if int(np.asarray(data.to_verifier).shape[0]) != spec.lm.vocab_size:
            raise ConfigError(f"drafter {spec.name!r} vocabulary: map covers "
                              f"{np.asarray(data.to_verifier).shape[0]} ids, model has "
                              f"{spec.lm.vocab_size}; allowed: equal sizes")
        d_pad.append((jnp.asarray(arr), jnp.asarray(ln)))
    _check_finite("verifier", v_params)
    for spec, data in zip(drafters, d_data):
        _check_finite(f"drafter {spec.name!r}", data.params)
    if stop_table is None:
        stop_table = np.zeros((verifier.vocab_size,), bool)
    buf_len = prompt.shape[1] + cfg.max_new_tokens + gamma + 1
    # Temperatures travel as arrays: one compiled program serves every temperature.
    d_data = [data.replace(temperature=jnp.float32(spec.temperature))
              for spec, data in zip(drafters, d_data)]
    drafters = [dataclasses.replace(spec, temperature=TRACED_TEMPERATURE) for spec in drafters]
    args = (cfg, verifier, tuple(drafters), v_params, tuple(d_data), jnp.asarray(slots),
            jnp.asarray(stop_table), jnp.asarray(prompt), jnp.asarray(plen),
            tuple(x for x, _ in d_pad), tuple(y for _, y in d_pad), jnp.asarray(row_keys))
    state, seconds = _timed(_run_speculative, *args, buf_len=buf_len)
    return GenerateResult(tokens=np.asarray(state.tokens), length=np.asarray(state.length),
                          start=np.asarray(state.start),
                          counters=jax.tree.map(np.asarray, state.counters), seconds=seconds)


def _timed(fn, *args, **kwargs):
    """Runs a jitted fn; if the call compiled, runs it again so `seconds` excludes compiling."""
    before = fn._cache_size()
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn(*args, **kwargs))
    seconds = time.perf_counter() - t0
    if fn._cache_size() != before:
        t0 = time.perf_counter()
        out = jax.block_until_ready(fn(*args, **kwargs))
        seconds = time.perf_counter() - t0
    return out, seconds


@functools.partial(jax.jit, static_argnames=("verifier", "temperature", "max_new",
                                             "coupled", "buf_len", "top_k", "top_p"))
def _run_autoregressive(verifier, v_params, prompt, prompt_len, row_keys, stop_table, active,
                        temperature, max_new, coupled, buf_len, top_k=0, top_p=1.0):
    b = prompt.shape[0]
    vcache, _ = _prefill_lm(verifier, v_params, prompt, prompt_len - 1)
    tokens = jnp.zeros((b, buf_len), jnp.int32).at[:, :prompt.shape[1]].set(prompt)

    def body(c):
        tokens, length, done, cache = c
        root = jnp.take_along_axis(tokens, (length - 1)[:, None], axis=1)
        logits, cache = verifier.forward(v_params, cache, root, (length - 1)[:, None],
                                         _causal(b, 1))
        p = sampling_probs(logits[:, 0], temperature, top_k=top_k, top_p=top_p)
        if coupled:
            tok = gumbel_argmax(p, _gumbel(row_keys, length, 0, p.shape[-1])[:, 0])
        else:
            tok = jax.vmap(sample)(_keys(row_keys, _STREAM_VERIFY, length), p)
        live = ~done
        tokens = jax.vmap(lambda r, t, i, w: jnp.where(w, r.at[i].set(t), r))(
            tokens, tok, length, live)
        cache = verifier.advance(cache, live.astype(jnp.int32))
        new_len = length + live
        done = done | (new_len - prompt_len >= max_new) | (live & stop_table[tok])
        return tokens, new_len, done, cache

    init = (tokens, prompt_len, ~active, vcache)
    return jax.lax.while_loop(lambda c: ~jnp.all(c[2]), body, init)


def autoregressive_generate(verifier, v_params, prompts, row_keys, *, temperature: float,
                            max_new_tokens: int, coupled: bool = False, stop_table=None,
                            top_k: int = 0, top_p: float = 1.0, bucket: int = 1,
                            min_width: int = 0, active=None) -> GenerateResult:
    """The baseline: the verifier alone, one token per call, same PRNG streams as the engine.

    With `coupled=True` each token is the Gumbel-max sample with the noise of its absolute
    position — the very token rule 'coupled' commits — so the two can be compared exactly.
    `active` (bool[B], default all) marks the rows to generate; the others are padding that
    keeps the batch shape (and the compiled program) fixed, and generate nothing.
    """
    EngineConfig(gamma=1, verifier_temperature=temperature, max_new_tokens=max_new_tokens)
    prompt, plen = pad_prompts(prompts, bucket=bucket, min_width=min_width)
    _check_context("verifier", verifier, prompt.shape[1] + max_new_tokens + 1)
    active = (np.ones((prompt.shape[0],), bool) if active is None
              else np.asarray(active, bool).reshape(prompt.shape[0]))
    _check_finite("verifier", v_params)
    if stop_table is None:
        stop_table = np.zeros((verifier.vocab_size,), bool)
    (tokens, length, _, _), seconds = _timed(
        _run_autoregressive, verifier, v_params, jnp.asarray(prompt), jnp.asarray(plen),
        jnp.asarray(row_keys), jnp.asarray(stop_table), jnp.asarray(active),
        temperature=float(temperature),
        max_new=max_new_tokens, coupled=coupled, buf_len=prompt.shape[1] + max_new_tokens + 1,
        top_k=top_k, top_p=top_p)
    return GenerateResult(tokens=np.asarray(tokens), length=np.asarray(length),
                          start=plen, counters=None, seconds=seconds)


def row_keys_for(seed: int, batch: int, share: int = 1) -> np.ndarray:
    """Key data u32[B, 2]: row b gets key (seed, b // share) — `share` rows share noise."""
    base = jax.random.key(seed)
    keys = jax.vmap(lambda i: jax.random.key_data(jax.random.fold_in(base, i)))(
        jnp.arange(batch) // share)
    return np.asarray(keys)
