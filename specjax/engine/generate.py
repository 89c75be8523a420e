"""Generation: prefill and the speculative loop, jitted.

`speculative_generate` is the entry point; the autoregressive baseline
(`specjax.engine.autoregressive`) shares its call machinery (`GenerateResult`,
`CallShapes`, `_run`); the loop itself is `specjax.engine.decode.SpecLoop` over the call's
`RoundInputs` and its `DecodeState`. A call validates its inputs on the host (before any
work, numpy only), moves every input to the device in ONE `jax.device_put`, runs the whole
generation in one ahead-of-time compiled `lax.while_loop` program and fetches tokens and
counters in ONE `jax.device_get`. Nothing else crosses between host and device inside a call:
parameters are checked for NaN/inf once per parameter array (`check_finite`, memoised),
shapes are read from shapes, and `seconds` times the compiled executable alone
(compilation is a separate step, never a rerun).

Caches follow the call, not the model's context: every cache is allocated with the
capacity this call can fill (prompt width + new tokens + one block, plus `reserve` for
continuations), since attention reads every slot of it.

Prefill (`specjax.engine.prefill`) is ragged for batches of ≥ 8 rows: rows sorted by
length are prefilled in up to 4 groups, each at its own width (`prefill_groups`), instead of
every row at the longest prompt's. Compiled programs and the parameter check live in
`specjax.engine.programs`.

Carrying caches across calls (plan steps): with ``return_state=True`` a result holds the
device-side `EngineState` (tokens, the verifier's and every drafter's cache); pass it
(or ``state.rows(idx)``) as ``state=`` to a later call to continue those rows for
``max_new_tokens`` more without re-encoding or re-prefilling anything. The state must
come from a call with the same drafters; `autoregressive.autoregressive_generate`
continuing such a state (a fallback step) passes the drafter caches through, and drafters
left behind the committed text catch up at the start of the next speculative call.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, Sequence

import jax
import numpy as np

from specjax.engine.checks import (
    check_drafters,
    check_features,
    check_slots,
    check_state_features,
    check_vocab_maps,
)
from specjax.engine.decode import RoundInputs, SpecLoop, consume_width
from specjax.engine.prefill import (
    CallShapes,
    check_context,
    pad_prompts,
    prefill,
    prefill_groups,
    prompt_state,
)
from specjax.engine.programs import cached_programs, check_finite, compiled_programs, run_program
from specjax.engine.spec import (
    DrafterData,
    DrafterSpec,
    EngineConfig,
    share_drafting,
)
from specjax.engine.state import DecodeState, EngineState
from specjax.errors import ConfigError
from specjax.verify.streams import row_keys_for

__all__ = [
    'GenerateResult',
    'EngineState',
    'speculative_call',
    'speculative_generate',
    'pad_prompts',
    'row_keys_for',
    'check_finite',
    'compiled_programs',
    'cached_programs',
    'prefill',
    'prefill_groups',
]


@dataclasses.dataclass
class GenerateResult:
    """Host-side result of one generate call.

    Attributes:
      tokens: i32[B, L] prompt + committed tokens (verifier ids).
      length: i32[B]; start: i32[B] where this call began; new tokens are
        tokens[b, start:length].
      counters: Counters as numpy arrays (None for the autoregressive baseline).
      seconds: wall-clock of the compiled program alone (no compilation, no transfers).
      state: the device-side `EngineState` when asked for (``return_state=True``).
    """

    tokens: np.ndarray
    length: np.ndarray
    start: np.ndarray
    counters: Any
    seconds: float = float("nan")
    state: Any = None

    def new_tokens(self, row: int) -> list[int]:
        return self.tokens[row, self.start[row] : self.length[row]].tolist()


def verifier_capacity(verifier, buf_len: int, gamma: int, n_slots: int = 1) -> int:
    """Slots the verifier's cache can fill in one run: every committed token but the last
    (the buffer less one block), and with S chains the tree's other (S − 1)·γ block slots
    (γ = 0: the verifier alone)."""
    cap = buf_len - gamma - 1 if n_slots == 1 else buf_len + (n_slots - 1) * gamma
    return min(cap, verifier.max_len)


# ----------------------------------------------------------------------------------------
# The speculative loop
# ----------------------------------------------------------------------------------------


def _outputs(state: DecodeState, return_state: bool):
    out = dict(tokens=state.tokens, length=state.length, start=state.start, counters=state.counters)
    if return_state:
        out['state'] = state.carry()
    return out


def _speculative(loop: SpecLoop, inputs: RoundInputs, carry, row_keys, return_state, catchups=None):
    """The speculative loop of both programs: rounds from `carry` until every row is done,
    then the call's outputs."""
    state = loop.start(carry, row_keys, inputs.max_new, catchups)
    return _outputs(loop.run(inputs, state), return_state)


def decode_state(cfg, drafters, carry: EngineState, row_keys, max_new, catchups=None):
    """`SpecLoop.start` for a caller holding the loop's parts (`specjax.measure.price_programs`)."""
    return SpecLoop(cfg, None, tuple(drafters)).start(carry, row_keys, max_new, catchups)


def round_body(cfg, verifier, drafters, *head):
    """The loop body of a speculative call, DecodeState → DecodeState, for a caller holding
    the loop's parts and a program's opening arguments (`RoundInputs.of`;
    `specjax.measure.price_programs`)."""
    return functools.partial(SpecLoop(cfg, verifier, tuple(drafters)).round, RoundInputs.of(*head))


@functools.partial(
    jax.jit, static_argnames=("cfg", "verifier", "drafters", "shapes", "return_state")
)
def _spec_from_prompts(
    v_params,
    d_data,
    slots,
    stop_table,
    v_temperature,
    max_new,
    prompt,
    prompt_len,
    d_prompts,
    d_prompt_len,
    row_keys,
    *,
    cfg,
    verifier,
    drafters,
    shapes: CallShapes,
    return_state,
):
    """The program of a speculative call from prompts: every cache prefilled
    (`prompt_state`), then the loop."""
    inputs = RoundInputs.of(v_params, d_data, slots, stop_table, v_temperature, max_new)
    carry = prompt_state(
        verifier,
        v_params,
        prompt,
        prompt_len,
        shapes,
        drafter_lms=[d.lm for d in drafters],
        d_params=[data.params for data in d_data],
        d_prompts=d_prompts,
        d_prompt_len=d_prompt_len,
    )
    return _speculative(SpecLoop(cfg, verifier, drafters), inputs, carry, row_keys, return_state)


@functools.partial(jax.jit, static_argnames=("cfg", "verifier", "drafters", "return_state"))
def _spec_from_state(
    v_params,
    d_data,
    slots,
    stop_table,
    v_temperature,
    max_new,
    carry,
    row_keys,
    *,
    cfg,
    verifier,
    drafters,
    return_state,
):
    """The program of a speculative call continuing a carried state: the drafters behind
    its text catch up (`SpecLoop.catch_up`), then the loop."""
    loop = SpecLoop(cfg, verifier, drafters)
    inputs = RoundInputs.of(v_params, d_data, slots, stop_table, v_temperature, max_new)
    carry, catchups = loop.catch_up(d_data, carry)
    return _speculative(loop, inputs, carry, row_keys, return_state, catchups)


def drafter_capacity(spec_lm, m: int, d_width: int, v_width: int, buf_len: int, gamma: int) -> int:
    """Slots a drafter's cache can fill in one run: its prompt, the pieces of every
    verifier token the run can commit (≤ m each) and its kept drafts."""
    return int(min(spec_lm.max_len, d_width + (buf_len - v_width) * m + gamma))


def speculative_generate(*args, **kwargs) -> GenerateResult:
    """Speculative generation of `cfg.max_new_tokens` per row (or until a stop token).

    Takes the arguments of `speculative_call` (see there) and runs the program it builds:
    one compiled `lax.while_loop`, tokens and counters fetched in one transfer.
    """
    fn, statics, call_args = speculative_call(*args, **kwargs)
    return _run(fn, statics, call_args, counters=True)


def speculative_call(
    cfg: EngineConfig,
    verifier,
    v_params,
    drafters: Sequence[DrafterSpec],
    d_data: Sequence[DrafterData],
    prompts: Sequence[Sequence[int]] | None,
    drafter_prompts: Sequence[Sequence[Sequence[int]]] | None,
    row_keys,
    slots: np.ndarray | None = None,
    stop_table: np.ndarray | None = None,
    bucket: int = 1,
    min_width: int = 0,
    drafter_min_width: Sequence[int] | None = None,
    *,
    state: EngineState | None = None,
    reserve: int = 0,
    return_state: bool = False,
) -> tuple:
    """The program of a speculative call, checked on the host: ``(fn, statics, args)``,
    run as ``fn(*args, **statics)`` (`speculative_generate` runs it; `specjax.tpu`
    lowers it for a compile target, ``v_params`` and the drafters' ``params`` then
    abstract ``jax.ShapeDtypeStruct`` leaves).

    Args:
      cfg: the engine configuration (γ, rule, verifier temperature, slots, budget).
      verifier / v_params: the verifier's functional LM and parameters.
      drafters / d_data: K drafters (specs; each may carry its own γ_i) and their arrays.
      prompts: B verifier-token prompts. drafter_prompts[k]: the same texts in drafter k's
        own tokenisation (B lists). Both None when continuing a `state`.
      row_keys: u32[B, 2] key data, one per row (`row_keys_for`). Rows that share a key
        share their randomness (rule 'coupled' relies on it).
      slots: i32[B, S] drafter indices per row in priority order, -1 = empty; default
        every row uses drafters 0..S−1.
      stop_table: bool[Vv], tokens that end a row (e.g. those containing a newline).
      bucket: prompt widths are rounded up to a multiple of it (fewer compilations).
      min_width / drafter_min_width: the verifier's and each drafter's padded prompt width
        is at least this (a run whose prompts grow keeps one compiled program).
      state: continue these rows (an `EngineState` from an earlier call with the same
        drafters, possibly continued by `autoregressive_generate`, or its `rows(idx)`);
        `max_new_tokens` more per row; `prompts` and `drafter_prompts` are then None.
      reserve: extra tokens per row that later continuations of this call will commit
        (sizes the token buffer and the caches; the first call of a plan reserves its
        later steps).
      return_state: keep the caches on the device and return them as `result.state`.

    Returns:
      (the jitted program, its static keyword arguments, its positional arguments).
    """
    windows = _check_drafter_set(cfg, verifier, drafters)
    fresh = state is None or prompts is not None
    if fresh:
        prompt, plen = pad_prompts(prompts, bucket=bucket, min_width=min_width)
    b = prompt.shape[0] if fresh else int(state.tokens.shape[0])
    host = _host_inputs(cfg, verifier, v_params, drafters, d_data, b, row_keys, slots, stop_table)
    statics = _spec_statics(cfg, verifier, drafters, return_state, d_data)
    if not fresh:
        _check_state(drafters, state)
        dev, head = _device_inputs(host, v_params, d_data)
        return _spec_from_state, statics, head + (state, dev['row_keys'])
    shapes, d_arr, d_len = _prompt_shapes(
        cfg,
        verifier,
        drafters,
        d_data,
        windows,
        prompt,
        plen,
        drafter_prompts,
        bucket,
        drafter_min_width,
        reserve,
    )
    if state is not None:
        raise ConfigError("state: give prompts=None to continue a state, or no state")
    host.update(prompt=prompt, prompt_len=plen, d_prompts=d_arr, d_prompt_len=d_len)
    dev, head = _device_inputs(host, v_params, d_data)
    tail = ('prompt', 'prompt_len', 'd_prompts', 'd_prompt_len', 'row_keys')
    return _spec_from_prompts, dict(statics, shapes=shapes), head + tuple(dev[n] for n in tail)


def _check_drafter_set(cfg: EngineConfig, verifier, drafters) -> list:
    """A call's drafters checked (at least one; their γ and features against the config
    and the verifier): each drafter's window γ_k (`check_drafters`)."""
    if len(drafters) < 1:
        raise ConfigError(
            "drafters: got none; allowed: ≥ 1 drafter (use "
            "autoregressive_generate for the verifier alone)"
        )
    windows = check_drafters(cfg, drafters)
    check_features(verifier, drafters)
    return windows


def _check_drafter_prompts(drafter_prompts, k: int, b: int) -> None:
    """The drafters' prompts of a call from prompts: one list of `b` per drafter."""
    if (
        drafter_prompts is None
        or len(drafter_prompts) != k
        or any(len(dp) != b for dp in drafter_prompts)
    ):
        raise ConfigError(f"drafter_prompts: need {k} lists of {b} prompts")


def _check_state(drafters, state: EngineState) -> None:
    """A carried state a speculative call continues: one cache per drafter of the call,
    holding the features its feature drafters read."""
    k = len(drafters)
    if len(state.dcaches) != k:
        raise ConfigError(
            f"state: holds {len(state.dcaches)} drafter caches; allowed: "
            f"one per drafter of this call ({k}); continue a verifier-only "
            "state with autoregressive_generate"
        )
    check_state_features(drafters, state)


speculative_generate.__signature__ = inspect.signature(speculative_call)


def _host_inputs(
    cfg: EngineConfig, verifier, v_params, drafters, d_data, b: int, row_keys, slots, stop_table
) -> dict:
    """A speculative call's per-row inputs on the host, checked (keys, slots, maps, weights)."""
    if np.shape(row_keys)[0] != b:
        raise ConfigError(f"row_keys: got {np.shape(row_keys)[0]} rows; allowed: one per row ({b})")
    slots = check_slots(cfg, slots, b, len(drafters))
    check_vocab_maps(drafters, d_data)
    check_finite("verifier", v_params)
    for spec, data in zip(drafters, d_data):
        check_finite(f"drafter {spec.name!r}", data.params)
    if stop_table is None:
        stop_table = np.zeros((verifier.vocab_size,), bool)
    return dict(
        slots=slots,
        stop_table=np.asarray(stop_table, bool),
        v_temperature=np.float32(cfg.verifier_temperature),
        temps=tuple(np.float32(d.temperature) for d in drafters),
        max_new=np.int32(cfg.max_new_tokens),
        row_keys=np.asarray(row_keys),
    )


def _spec_statics(cfg: EngineConfig, verifier, drafters, return_state: bool, d_data=None) -> dict:
    """The static arguments of a speculative program (the call's shapes are added later);
    with `d_data`, a drafter named twice drafts with its twin in one pass (`share_drafting`)."""
    statics = tuple(d.static for d in drafters)
    if d_data is not None:
        statics = share_drafting(statics, d_data)
    # The compiled program depends on neither the verifier's temperature nor the token
    # budget (inputs); the budget's shapes are in `shapes.buf_len`.
    return dict(
        cfg=dataclasses.replace(cfg, verifier_temperature=1.0, max_new_tokens=1),
        verifier=verifier,
        drafters=statics,
        return_state=return_state,
    )


def _device_inputs(host: dict, v_params, d_data) -> tuple[dict, tuple]:
    """The host inputs on the device (one transfer) and the arguments both programs open with."""
    dev = jax.device_put(host)
    d_data = tuple(data.replace(temperature=t) for data, t in zip(d_data, dev['temps']))
    head = (v_params, d_data, dev['slots'], dev['stop_table'], dev['v_temperature'], dev['max_new'])
    return dev, head


def _prompt_shapes(
    cfg: EngineConfig,
    verifier,
    drafters,
    d_data,
    windows,
    prompt,
    plen,
    drafter_prompts,
    bucket: int,
    drafter_min_width,
    reserve: int,
):
    """The shapes of a speculative call from prompts, the drafters' prompts and every
    context checked — (CallShapes, the drafters' padded prompts, their lengths)."""
    k = len(drafters)
    _check_drafter_prompts(drafter_prompts, k, prompt.shape[0])
    gamma = max(windows)
    buf_len = prompt.shape[1] + cfg.max_new_tokens + reserve + gamma + 1
    check_context(
        "verifier", verifier, prompt.shape[1] + cfg.max_new_tokens + reserve + cfg.n_slots * gamma
    )
    v_cap = verifier_capacity(verifier, buf_len, gamma, cfg.n_slots)
    d_min = list(drafter_min_width) if drafter_min_width is not None else [0] * k
    d_arr, d_len, d_caps = [], [], []
    for spec, data, dp, w, g in zip(drafters, d_data, drafter_prompts, d_min, windows):
        arr, ln = pad_prompts(dp, field=f"drafter {spec.name!r} prompt", bucket=bucket, min_width=w)
        m = int(data.retok.shape[1])
        # A drafter of another tokenizer may spell a verifier token in up to m of its
        # own tokens; the prompt plus one consume block must fit. Past that, its cache
        # drops writes (models/cache.py): its drafts degrade, the output stays exact
        # (q is what it sampled from).
        check_context(f"drafter {spec.name!r}", spec.lm, arr.shape[1] + consume_width(m, g + 1) + g)
        d_arr.append(arr)
        d_len.append(ln)
        d_caps.append(drafter_capacity(spec.lm, m, arr.shape[1], prompt.shape[1], buf_len, g))
    v_groups = prefill_groups(plen - 1, int(prompt.shape[1]), bucket)
    d_groups = tuple(prefill_groups(ln, int(arr.shape[1]), bucket) for arr, ln in zip(d_arr, d_len))
    shapes = CallShapes(
        buf_len=buf_len, v_cap=v_cap, d_caps=tuple(d_caps), v_groups=v_groups, d_groups=d_groups
    )
    return shapes, tuple(d_arr), tuple(d_len)


def _run(fn, statics: dict, args: tuple, counters: bool) -> GenerateResult:
    """Runs a generate program; tokens and counters come back in one transfer, the state
    (when asked for) stays on the device."""
    out, seconds = run_program(fn, statics, args)
    carried = out.pop('state', None)
    host_out = jax.device_get(out)
    return GenerateResult(
        tokens=host_out['tokens'],
        length=host_out['length'],
        start=host_out['start'],
        counters=host_out['counters'] if counters else None,
        seconds=seconds,
        state=carried,
    )
