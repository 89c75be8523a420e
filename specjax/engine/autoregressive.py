"""The autoregressive baseline: the verifier alone, one token per step, jitted.

`autoregressive_generate` is the reference every speculative call is measured and checked
against: the same PRNG streams as the engine (with ``coupled=True`` the very Gumbel-max
token rule 'coupled' commits), the same call machinery as `speculative_generate` (inputs
checked on the host, one `jax.device_put`, one compiled `lax.while_loop`, one
`jax.device_get`; `specjax.engine.generate`) and the same carried `EngineState`: a state's
drafter caches pass through untouched and catch up in the next speculative call.
The loop is `ARLoop` (static) over the call's `ARInputs` and its `ARState`, shared with
continuous batching; `ar_step` is its trip for the priced programs.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax.engine.generate import GenerateResult, _run, verifier_capacity
from specjax.engine.prefill import (
    CallShapes,
    check_context,
    pad_prompts,
    prefill_cache,
    prefill_groups,
)
from specjax.engine.programs import check_finite
from specjax.engine.spec import EngineConfig
from specjax.engine.state import (
    ARState,
    EngineState,
    bool_V,
    by_position,
    check_shapes,
    f32_,
    i32_or_B,
    keys_B,
)
from specjax.errors import ConfigError
from specjax.models.api import causal_block_mask
from specjax.verify.distributions import gumbel_argmax, sampling_probs
from specjax.verify.streams import STREAM_VERIFY, fold_keys, gumbel_noise, sample_rows

__all__ = ['ARInputs', 'ARLoop', 'ar_step', 'autoregressive_call', 'autoregressive_generate']


@struct.dataclass(kw_only=True)
class ARInputs:
    """What every step of the autoregressive loop reads besides its state: the program's
    inputs (the programs take them positionally, in this order: `of`).

    Attributes:
      v_params: the verifier's parameters.
      row_keys: u32[B, 2] key data, one stream per row.
      stop_table: bool[V] tokens that end a row.
      temperature: f32[] the verifier's τ.
      max_new: i32[] or i32[B] tokens a row may generate in this call.
    """

    v_params: Any
    row_keys: keys_B
    stop_table: bool_V
    temperature: f32_
    max_new: i32_or_B

    @classmethod
    def of(cls, *args) -> "ARInputs":
        """The inputs from a program's arguments (v_params, row_keys, stop_table,
        temperature, max_new)."""
        return by_position(cls, args)


@dataclasses.dataclass(frozen=True)
class ARLoop:
    """The autoregressive loop's static parts (hashable: a jitted program's static
    argument): the verifier and how it samples (`coupled`: the Gumbel-max token of rule
    'coupled'; `top_k` / `top_p` filters). `step` is one token for every live row, `run`
    the loop from a carried state."""

    verifier: Any
    coupled: bool = False
    top_k: int = 0
    top_p: float = 1.0

    def step(self, inputs: ARInputs, start, state: ARState) -> ARState:
        """One token sampled and written for every live row (`start`: i32[B] where the
        call began)."""
        verifier = self.verifier
        tokens, length, done, cache = state.tokens, state.length, state.done, state.vcache
        b, buf_len = tokens.shape
        root = jnp.take_along_axis(tokens, (length - 1)[:, None], axis=1)
        logits, cache = verifier.forward(
            inputs.v_params, cache, root, (length - 1)[:, None], causal_block_mask(b, 1)
        )
        p = sampling_probs(logits[:, 0], inputs.temperature, top_k=self.top_k, top_p=self.top_p)
        if self.coupled:
            tok = gumbel_argmax(p, gumbel_noise(inputs.row_keys, length, 0, p.shape[-1])[:, 0])
        else:
            tok = sample_rows(fold_keys(inputs.row_keys, STREAM_VERIFY, length), p)
        live = ~done
        tokens = jax.vmap(lambda r, t, i, w: jnp.where(w, r.at[i].set(t), r))(
            tokens, tok, length, live
        )
        cache = verifier.advance(cache, live.astype(jnp.int32))
        new_len = length + live
        done = (
            done
            | (new_len - start >= inputs.max_new)
            | (new_len >= buf_len - 1)
            | (live & inputs.stop_table[tok])
        )
        return ARState(tokens=tokens, length=new_len, done=done, vcache=cache)

    def run(self, inputs: ARInputs, carry: EngineState, active, return_state: bool) -> dict:
        """Steps from `carry` until every row is done (`active` bool[B]: the rows to
        generate; the others are padding), then the call's outputs (with `return_state`
        the carried state, its drafter caches passed through)."""
        buf_len = carry.tokens.shape[1]
        start = carry.length
        done = ~active | (carry.length >= buf_len - 1)
        state = ARState(tokens=carry.tokens, length=carry.length, done=done, vcache=carry.vcache)
        check_shapes(inputs, state)
        step = functools.partial(self.step, inputs, start)
        state = jax.lax.while_loop(lambda s: ~jnp.all(s.done), step, state)
        out = dict(tokens=state.tokens, length=state.length, start=start)
        if return_state:
            out['state'] = carry.replace(
                tokens=state.tokens, length=state.length, vcache=state.vcache
            )
        return out


def ar_step(
    verifier, v_params, row_keys, stop_table, temperature, max_new, start, c, *, coupled,
    top_k, top_p,
):  # fmt: skip
    """`ARLoop.step` for a caller holding the loop's parts (`specjax.measure.price_programs`):
    c = (tokens, length, done, cache) → the same."""
    inputs = ARInputs.of(v_params, row_keys, stop_table, temperature, max_new)
    state = ARState(tokens=c[0], length=c[1], done=c[2], vcache=c[3])
    s = ARLoop(verifier, coupled, top_k, top_p).step(inputs, start, state)
    return s.tokens, s.length, s.done, s.vcache


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


@functools.partial(jax.jit, static_argnames=("loop", "shapes", "return_state"))
def _ar_from_prompts(
    v_params, prompt, prompt_len, row_keys, stop_table, active, temperature, max_new, *, loop,
    shapes: CallShapes, return_state,
):  # fmt: skip
    """The program of a call from prompts: `_prompt_state`, then the loop."""
    carry = _prompt_state(loop.verifier, v_params, prompt, prompt_len, shapes)
    inputs = ARInputs.of(v_params, row_keys, stop_table, temperature, max_new)
    return loop.run(inputs, carry, active, return_state)


@functools.partial(jax.jit, static_argnames=("loop", "return_state"))
def _ar_from_state(
    v_params, carry, row_keys, stop_table, active, temperature, max_new, *, loop: ARLoop,
    return_state,
):  # fmt: skip
    """The program of a call continuing a carried state: the loop from `carry`."""
    inputs = ARInputs.of(v_params, row_keys, stop_table, temperature, max_new)
    return loop.run(inputs, carry, active, return_state)


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
    statics = dict(loop=ARLoop(verifier, coupled, top_k, top_p), return_state=return_state)
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
