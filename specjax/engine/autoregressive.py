"""The autoregressive baseline: the verifier alone, one token per step, jitted.

`autoregressive_generate` is the reference every speculative call is measured and checked
against: the same PRNG streams as the engine (with ``coupled=True`` the very Gumbel-max
token rule 'coupled' commits), the same call machinery as `speculative_generate` (inputs
checked on the host, one `jax.device_put`, one compiled `lax.while_loop`, one
`jax.device_get`; `specjax.engine.generate`) and the same carried `EngineState`: a state's
drafter caches pass through untouched and catch up in the next speculative call.
`ar_step` / `ar_loop` are the loop's trip and loop, shared with continuous batching and
the priced programs.
"""

from __future__ import annotations

import functools
import inspect

import jax
import jax.numpy as jnp
import numpy as np

from specjax.engine.generate import CallShapes, GenerateResult, _run, verifier_capacity
from specjax.engine.prefill import check_context, pad_prompts, prefill_cache, prefill_groups
from specjax.engine.programs import check_finite
from specjax.engine.spec import EngineConfig
from specjax.engine.state import EngineState
from specjax.errors import ConfigError
from specjax.models.api import causal_block_mask
from specjax.verify.distributions import gumbel_argmax, sampling_probs
from specjax.verify.streams import STREAM_VERIFY, fold_keys, gumbel_noise, sample_rows

__all__ = ['ar_loop', 'ar_step', 'autoregressive_call', 'autoregressive_generate']


_AR_STATICS = ("verifier", "coupled", "top_k", "top_p", "return_state")


def ar_step(
    verifier,
    v_params,
    row_keys,
    stop_table,
    temperature,
    max_new,
    start,
    c,
    *,
    coupled,
    top_k,
    top_p,
):
    """One step of the autoregressive loop: c = (tokens, length, done, cache) → the same,
    one token sampled and written for every live row."""
    tokens, length, done, cache = c
    b, buf_len = tokens.shape
    root = jnp.take_along_axis(tokens, (length - 1)[:, None], axis=1)
    logits, cache = verifier.forward(
        v_params, cache, root, (length - 1)[:, None], causal_block_mask(b, 1)
    )
    p = sampling_probs(logits[:, 0], temperature, top_k=top_k, top_p=top_p)
    if coupled:
        tok = gumbel_argmax(p, gumbel_noise(row_keys, length, 0, p.shape[-1])[:, 0])
    else:
        tok = sample_rows(fold_keys(row_keys, STREAM_VERIFY, length), p)
    live = ~done
    tokens = jax.vmap(lambda r, t, i, w: jnp.where(w, r.at[i].set(t), r))(tokens, tok, length, live)
    cache = verifier.advance(cache, live.astype(jnp.int32))
    new_len = length + live
    done = done | (new_len - start >= max_new) | (new_len >= buf_len - 1) | (live & stop_table[tok])
    return tokens, new_len, done, cache


def ar_loop(
    verifier,
    v_params,
    carry: EngineState,
    row_keys,
    stop_table,
    active,
    temperature,
    max_new,
    coupled,
    top_k,
    top_p,
    return_state,
):
    buf_len = carry.tokens.shape[1]
    start = carry.length
    body = functools.partial(
        ar_step,
        verifier,
        v_params,
        row_keys,
        stop_table,
        temperature,
        max_new,
        start,
        coupled=coupled,
        top_k=top_k,
        top_p=top_p,
    )
    done = ~active | (carry.length >= buf_len - 1)
    tokens, length, _, vcache = jax.lax.while_loop(
        lambda c: ~jnp.all(c[2]), body, (carry.tokens, carry.length, done, carry.vcache)
    )
    out = dict(tokens=tokens, length=length, start=start)
    if return_state:
        out['state'] = carry.replace(tokens=tokens, length=length, vcache=vcache)
    return out


def _prompt_state(verifier, v_params, prompt, prompt_len, shapes: CallShapes) -> EngineState:
    """The state a call from prompts starts from: the verifier's cache prefilled with every
    prompt token but the last (the first step's root), the prompts in a token buffer of
    `shapes.buf_len`, no drafter caches."""
    b = prompt.shape[0]
    vcache, _ = prefill_cache(
        verifier, v_params, prompt, prompt_len - 1, shapes.v_cap, shapes.v_groups
    )
    tokens = jnp.zeros((b, shapes.buf_len), jnp.int32).at[:, : prompt.shape[1]].set(prompt)
    return EngineState(
        tokens=tokens,
        length=prompt_len,
        vcache=vcache,
        dcaches=(),
        dsynced=jnp.zeros((0, b), jnp.int32),
        dlogits=(),
    )


@functools.partial(jax.jit, static_argnames=_AR_STATICS + ("shapes",))
def _ar_from_prompts(
    v_params, prompt, prompt_len, *inputs, verifier, shapes: CallShapes, **statics
):
    """The program of a call from prompts: `_prompt_state`, then the loop of
    `_ar_from_state` (`inputs`: its arguments after the state; `statics`: its static
    arguments other than the verifier)."""
    carry = _prompt_state(verifier, v_params, prompt, prompt_len, shapes)
    return ar_loop(verifier, v_params, carry, *inputs, **statics)


@functools.partial(jax.jit, static_argnames=_AR_STATICS)
def _ar_from_state(
    v_params,
    carry,
    row_keys,
    stop_table,
    active,
    temperature,
    max_new,
    *,
    verifier,
    coupled,
    top_k,
    top_p,
    return_state,
):
    """The program of a call continuing a carried state: `ar_loop` from `carry`."""
    return ar_loop(
        verifier,
        v_params,
        carry,
        row_keys,
        stop_table,
        active,
        temperature,
        max_new,
        coupled,
        top_k,
        top_p,
        return_state,
    )


def autoregressive_generate(*args, **kwargs) -> GenerateResult:
    """The baseline: the verifier alone, one token per step, same PRNG streams as the
    engine. Takes the arguments of `autoregressive_call` (see there) and runs its program."""
    fn, statics, call_args = autoregressive_call(*args, **kwargs)
    return _run(fn, statics, call_args, counters=False)


def autoregressive_call(
    verifier,
    v_params,
    prompts,
    row_keys,
    *,
    temperature: float,
    max_new_tokens: int,
    coupled: bool = False,
    stop_table=None,
    top_k: int = 0,
    top_p: float = 1.0,
    bucket: int = 1,
    min_width: int = 0,
    active=None,
    state: EngineState | None = None,
    reserve: int = 0,
    return_state: bool = False,
) -> tuple:
    """The program of an autoregressive call, checked on the host: ``(fn, statics, args)``
    (as `specjax.engine.generate.speculative_call`).

    With `coupled=True` each token is the Gumbel-max sample with the noise of its absolute
    position — the very token rule 'coupled' commits — so the two can be compared exactly.
    `active` (bool[B], default all) marks the rows to generate; the others are padding that
    keeps the batch shape (and the compiled program) fixed, and generate nothing.
    `state` / `reserve` / `return_state`: as in `speculative_generate` (``prompts=None``
    with a state; a state's drafter caches pass through untouched and catch up in the next
    speculative call).
    """
    EngineConfig(gamma=1, verifier_temperature=temperature, max_new_tokens=max_new_tokens)
    check_finite("verifier", v_params)
    if stop_table is None:
        stop_table = np.zeros((verifier.vocab_size,), bool)
    statics = dict(
        verifier=verifier, coupled=coupled, top_k=top_k, top_p=top_p, return_state=return_state
    )
    if state is None:
        prompt, plen = pad_prompts(prompts, bucket=bucket, min_width=min_width)
        b = prompt.shape[0]
        statics['shapes'] = _prompt_shapes(verifier, prompt, plen, max_new_tokens, reserve, bucket)
    else:
        if prompts is not None:
            raise ConfigError("state: give prompts=None to continue a state, or no state")
        b = int(state.tokens.shape[0])
    host = _host_inputs(b, row_keys, stop_table, active, temperature, max_new_tokens)
    if state is None:
        host.update(prompt=prompt, prompt_len=plen)
    dev = jax.device_put(host)
    if state is None:
        args = (v_params, dev['prompt'], dev['prompt_len'], *_inputs(dev))
        return _ar_from_prompts, statics, args
    return _ar_from_state, statics, (v_params, state, *_inputs(dev))


def _prompt_shapes(verifier, prompt, plen, max_new_tokens: int, reserve: int, bucket: int):
    """The `CallShapes` of a call from the padded prompts, the verifier's context checked:
    a buffer of the prompt width, the new and reserved tokens and the last step's root."""
    check_context("verifier", verifier, prompt.shape[1] + max_new_tokens + reserve + 1)
    buf_len = prompt.shape[1] + max_new_tokens + reserve + 1
    return CallShapes(
        buf_len=buf_len,
        v_cap=verifier_capacity(verifier, buf_len, 0),
        v_groups=prefill_groups(plen - 1, int(prompt.shape[1]), bucket),
    )


def _host_inputs(b: int, row_keys, stop_table, active, temperature, max_new_tokens) -> dict:
    """An autoregressive call's per-row inputs on the host (`active` default: every row)."""
    active = np.ones((b,), bool) if active is None else np.asarray(active, bool).reshape(b)
    return dict(
        row_keys=np.asarray(row_keys),
        stop_table=np.asarray(stop_table, bool),
        active=active,
        temperature=np.float32(temperature),
        max_new=np.int32(max_new_tokens),
    )


def _inputs(dev: dict) -> tuple:
    """The arguments both programs end with (after the prompts or the state), on the device."""
    return tuple(
        dev[name] for name in ('row_keys', 'stop_table', 'active', 'temperature', 'max_new')
    )


autoregressive_generate.__signature__ = inspect.signature(autoregressive_call)
