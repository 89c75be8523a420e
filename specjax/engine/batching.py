"""Continuous batching: a queue of prompts served by B rows that stay full.

`speculative_generate` and `autoregressive_generate` run a static batch: it runs as many
rounds as its slowest row, and rows that finish early (a stop token, a smaller budget)
idle until then. `continuous_generate` serves a queue of N prompts with B rows in
*chunks*: one compiled program runs `chunk` rounds (verifier calls) of every live row;
then, on the host, the rows whose prompt is finished get the next pending prompts —
prefilled by one program on just those rows and scattered into the batch state at the
freed rows (`EngineState.set_rows`) — and the next chunk runs. A batch then runs at its
rows' mean speed, not its slowest row's. The host touches the batch once per chunk: one
refill program (when rows were freed), one chunk program, one transfer each way.

A chunk counts rounds, not tokens: a round costs the same whatever it commits, and rows
that all run the same number of rounds never wait for one another inside a chunk (with
a token count, rows that accept more would idle while the others catch up). The
verifier alone commits one token per round, so its chunk is `chunk` tokens; a
speculative row commits at most chunk · (γ + 1).

Exactness: each prompt's tokens equal, token for token, those the same prompt gets in a
static batch with the same row key and budget, whichever row serves it and whatever else
runs beside it. PRNG streams are folded from the row key and the absolute position
(`specjax.verify.streams`), a refilled row restarts from its own prompt (its budget
counts from there, its key is the prompt's), and a chunk ends on a round boundary with
every live row having run the same rounds, so a continuing row's next round is the one a
static call would run next, from the same state (its drafters included: nothing runs on
a row between its rounds). Cutting rounds at a token count instead — `max_new_tokens`
over continued calls — would move where the next round starts, and with it which random
numbers a sampling rule reads: the same law, another sample.

Shapes are fixed for the whole call — B rows, a token buffer and caches sized from the
longest prompt and the largest budget, refills padded to a power of two of rows — so a
call compiles at most 2 + ⌈log₂ B⌉ programs whatever N, all before its first chunk
(`specjax.engine.programs.compiled_programs`), and a second call of the same shapes
compiles none.

The chunk size trades idle rows against per-chunk overhead: a small chunk refills
finished rows sooner (a finished row idles for at most the rest of its chunk, < `chunk`
rounds), but each chunk costs a host round-trip and, when rows finished, a refill
program, and small refills prefill fewer rows per call (less efficient per row); a chunk
of at least the largest budget is static batching with a queue. The refill prefills
prompts padded to the queue's widest (attention reads every cache slot, so a wide
`bucket` slows prefill and decoding alike).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax.engine.autoregressive import ARInputs, ARLoop
from specjax.engine.batching_queue import Queue, Rows, Tally, check_queue, pad_rows
from specjax.engine.checks import check_features
from specjax.engine.decode import RoundInputs, SpecLoop
from specjax.engine.prefill import CallShapes, prompt_state
from specjax.engine.programs import check_finite, compile_program, run_program
from specjax.engine.spec import DrafterData, DrafterSpec, EngineConfig, share_drafting
from specjax.engine.state import EngineState
from specjax.verify import registry

__all__ = ['ContinuousResult', 'continuous_generate', 'refill_sizes']


@dataclasses.dataclass
class ContinuousResult:
    """Host-side result of `continuous_generate` (N prompts, K drafters; K = 0 alone).

    Attributes:
      tokens: N lists of new tokens (verifier ids), in prompt order; a stop token that
        ended a prompt is kept.
      rounds: i32[N] verifier calls (rounds) per prompt; tokens, for the verifier alone.
      committed: i32[N] tokens committed per prompt (len(tokens[i])).
      from_draft: i32[N] committed tokens that were drafts.
      proposed / accepted: i32[N, K] drafts proposed / accepted, per drafter.
      chunks: chunk programs run; refills: refill programs run.
      programs: distinct compiled programs the call runs (all compiled before it starts).
      seconds: wall-clock of the compiled programs alone (chunks and refills; no
        compilation, no transfers); refill_seconds: the refills' part of it.
      wall_seconds: the serve loop end to end (programs, transfers, host bookkeeping;
        compilation excluded).
    """

    tokens: list
    rounds: np.ndarray
    committed: np.ndarray
    from_draft: np.ndarray
    proposed: np.ndarray
    accepted: np.ndarray
    chunks: int = 0
    refills: int = 0
    programs: int = 0
    seconds: float = float("nan")
    wall_seconds: float = float("nan")
    refill_seconds: float = float("nan")


def refill_sizes(batch: int) -> tuple[int, ...]:
    """The row counts a refill is padded to: powers of two below `batch`, and `batch`."""
    sizes, r = [], 1
    while r < batch:
        sizes.append(r)
        r *= 2
    return tuple(sizes) + (batch,)


# ----------------------------------------------------------------------------------------
# Compiled programs: refill (prefill some rows, scatter them in) and one chunk of decoding
# ----------------------------------------------------------------------------------------

_REFILL_STATICS = ("verifier", "drafter_lms", "shapes")


def _prefill_rows(
    v_params, d_params, prompt, prompt_len, d_prompts, d_prompt_len, *, verifier, drafter_lms,
    shapes: CallShapes,
) -> EngineState:  # fmt: skip
    """The state of R fresh rows, as the static engine's prefill makes it (`prompt_state`)."""
    return prompt_state(
        verifier,
        v_params,
        prompt,
        prompt_len,
        shapes,
        drafter_lms=drafter_lms,
        d_params=d_params,
        d_prompts=d_prompts,
        d_prompt_len=d_prompt_len,
    )


@functools.partial(jax.jit, static_argnames=_REFILL_STATICS, donate_argnames=("state",))
def _refill(v_params, d_params, state, idx, *prompts, **statics):
    """The refill: the rows of `prompts` (prompt, prompt_len, d_prompts, d_prompt_len)
    prefilled and written into `state` at rows `idx`."""
    return state.set_rows(idx, _prefill_rows(v_params, d_params, *prompts, **statics))


@functools.partial(
    jax.jit, static_argnames=("cfg", "verifier", "drafters"), donate_argnames=("carry",)
)
def _spec_chunk(
    v_params, d_data, slots, stop_table, v_temperature, max_new, chunk, carry, row_keys, *, cfg,
    verifier, drafters,
):  # fmt: skip
    """`chunk` rounds of every row with budget left (`max_new` i32[B], 0 for an idle row),
    fewer for a row that finishes; the loop ends when every row is done."""
    loop = SpecLoop(cfg, verifier, drafters)
    inputs = RoundInputs.of(v_params, d_data, slots, stop_table, v_temperature, max_new)
    state = loop.start(carry, row_keys, max_new)
    # Every live row has run as many rounds as the others: they pause together.
    pause = lambda r: r.replace(done=r.done | (r.counters.rounds >= chunk))  # noqa: E731
    state = loop.run(inputs, state, after=pause)
    c = state.counters
    return state.carry(), dict(
        rounds=c.rounds, from_draft=c.from_draft, proposed=c.proposed, accepted=c.accepted
    )


@functools.partial(jax.jit, static_argnames=("loop",), donate_argnames=("carry",))
def _ar_chunk(v_params, carry, row_keys, stop_table, active, temperature, max_new, *, loop):
    """Up to `max_new` i32[B] tokens per active row (the chunk, cut to the budget left)."""
    inputs = ARInputs.of(v_params, row_keys, stop_table, temperature, max_new)
    return loop.run(inputs, carry, active, return_state=True)['state'], {}


# ----------------------------------------------------------------------------------------
# The serve loop
# ----------------------------------------------------------------------------------------


def continuous_generate(
    cfg: EngineConfig,
    verifier,
    v_params,
    prompts: Sequence[Sequence[int]],
    row_keys,
    *,
    batch: int,
    chunk: int,
    max_new_tokens: int | Sequence[int] | None = None,
    drafters: Sequence[DrafterSpec] | None = None,
    d_data: Sequence[DrafterData] | None = None,
    drafter_prompts: Sequence[Sequence[Sequence[int]]] | None = None,
    slots: np.ndarray | None = None,
    stop_table: np.ndarray | None = None,
    bucket: int = 1,
) -> ContinuousResult:
    """Serves N prompts with `batch` rows that are refilled as prompts finish.

    Speculative when `drafters` are given (`speculative_generate`'s engine), the verifier
    alone when `drafters` is None (`autoregressive_generate`'s loop). Each prompt's tokens
    are those of a static batch with the same row key and budget (module docstring).

    Args:
      cfg: the engine configuration (γ, rule, verifier temperature / top-k / top-p, slots;
        `cfg.max_new_tokens` is the default budget). The verifier alone samples at the
        config's temperature, and with Gumbel-max (`autoregressive_generate`'s
        ``coupled=True``) when `cfg.rule` is a coupled rule.
      verifier / v_params: the verifier's functional LM and parameters.
      prompts: N verifier-token prompts, served in this order.
      row_keys: u32[N, 2] key data, one per prompt (`row_keys_for(seed, N)`); the prompt's
        randomness whichever row serves it.
      batch: B, rows served at once (≥ 1).
      chunk: rounds (verifier calls) per row per chunk program, ≥ 1 (the module
        docstring says what it trades): `chunk` tokens for the verifier alone, at most
        chunk · (γ + 1) for a speculative row.
      max_new_tokens: the budget, one for every prompt or one per prompt (default
        `cfg.max_new_tokens`).
      drafters / d_data: K drafters and their arrays, or None for the verifier alone.
      drafter_prompts: drafter_prompts[k] the N prompts in drafter k's own tokenisation.
      slots: i32[N, S] drafter indices per prompt in priority order, -1 = empty (default:
        drafters 0..S−1 for every prompt).
      stop_table: bool[Vv], tokens that end a prompt (e.g. those holding a newline).
      bucket: prompt widths are rounded up to a multiple of it (queues of similar prompts
        share compiled programs).

    Returns:
      ContinuousResult.
    """
    q = check_queue(
        cfg,
        verifier,
        prompts,
        row_keys,
        batch=batch,
        chunk=chunk,
        max_new_tokens=max_new_tokens,
        drafters=drafters,
        d_data=d_data,
        drafter_prompts=drafter_prompts,
        slots=slots,
        stop_table=stop_table,
        bucket=bucket,
    )
    check_features(verifier, drafters or ())
    check_finite("verifier", v_params)
    for d, data in zip(q.drafters, q.d_data):
        check_finite(f"drafter {d.name!r}", data.params)
    refill = _refill_program(verifier, v_params, q)
    if q.spec:
        program = _spec_chunk_program(cfg, verifier, v_params, q)
    else:
        program = _ar_chunk_program(cfg, verifier, v_params, q)
    rows = Rows.idle(q)
    state = _compile_all(q, refill, program, rows)
    return _serve(q, refill, program, rows, state)


# ----------------------------------------------------------------------------------------
# The call's programs and how their arguments are built
# ----------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Program:
    """A compiled program of the call: the jitted function, its static arguments, and
    `args(...)` building its arguments from the host's mirrors."""

    fn: Any
    statics: dict
    args: Callable


def _refill_program(verifier, v_params, q: Queue) -> _Program:
    """The refill: prompts `ids` prefilled into batch rows `rows`, padded to `size` rows;
    ``args(state, rows, ids, size)``."""
    statics = dict(verifier=verifier, drafter_lms=tuple(d.lm for d in q.drafters), shapes=q.shapes)
    d_params = tuple(data.params for data in q.d_data)

    def args(state, rows, ids, size):
        idx = np.full((size,), q.batch, np.int32)  # ≥ B: a padding row, dropped
        idx[: len(rows)] = rows
        arr, lens = pad_rows(q.prompts, ids, q.width, size)
        d_arr, d_len = (
            zip(*[pad_rows(dp, ids, w, size) for dp, w in zip(q.drafter_prompts, q.d_widths)])
            if q.spec
            else ((), ())
        )
        dev = jax.device_put(
            dict(
                idx=idx,
                prompt=arr,
                prompt_len=lens,
                d_prompts=tuple(d_arr),
                d_prompt_len=tuple(d_len),
            )
        )
        return (
            v_params,
            d_params,
            state,
            dev['idx'],
            dev['prompt'],
            dev['prompt_len'],
            dev['d_prompts'],
            dev['d_prompt_len'],
        )

    return _Program(_refill, statics, args)


def _spec_chunk_program(cfg: EngineConfig, verifier, v_params, q: Queue) -> _Program:
    """A chunk of speculative rounds; ``args(state, keys, row_slots, max_new, live)``."""
    cfg_static = dataclasses.replace(cfg, verifier_temperature=1.0, max_new_tokens=1)
    drafters = share_drafting(tuple(d.static for d in q.drafters), q.d_data)
    statics = dict(cfg=cfg_static, verifier=verifier, drafters=drafters)
    temps = tuple(np.float32(d.temperature) for d in q.drafters)
    fixed = jax.device_put(
        dict(
            stop_table=q.stop_table,
            temps=temps,
            v_temperature=np.float32(cfg.verifier_temperature),
            chunk=np.int32(q.chunk),
        )
    )
    d_data = tuple(data.replace(temperature=t) for data, t in zip(q.d_data, fixed['temps']))

    def args(state, keys, row_slots, max_new, live):
        dev = jax.device_put(dict(keys=keys, slots=row_slots, max_new=max_new))
        return (
            v_params,
            d_data,
            dev['slots'],
            fixed['stop_table'],
            fixed['v_temperature'],
            dev['max_new'],
            fixed['chunk'],
            state,
            dev['keys'],
        )

    return _Program(_spec_chunk, statics, args)


def _ar_chunk_program(cfg: EngineConfig, verifier, v_params, q: Queue) -> _Program:
    """A chunk of the verifier alone; ``args(state, keys, row_slots, max_new, live)``."""
    coupled = registry.get(cfg.rule).coupled
    statics = dict(loop=ARLoop(verifier, coupled, cfg.verifier_top_k, cfg.verifier_top_p))
    fixed = jax.device_put(
        dict(stop_table=q.stop_table, temperature=np.float32(cfg.verifier_temperature))
    )

    def args(state, keys, row_slots, max_new, live):
        del row_slots
        dev = jax.device_put(
            dict(keys=keys, active=live, max_new=np.minimum(max_new, q.chunk).astype(np.int32))
        )
        return (
            v_params,
            state,
            dev['keys'],
            fixed['stop_table'],
            dev['active'],
            fixed['temperature'],
            dev['max_new'],
        )

    return _Program(_ar_chunk, statics, args)


# ----------------------------------------------------------------------------------------
# The serve loop
# ----------------------------------------------------------------------------------------


def _compile_all(q: Queue, refill: _Program, program: _Program, rows: Rows):
    """Every program of the call compiled before the clock starts (a refill pads its rows
    to one of `refill_sizes(batch)`); returns a blank batch state of the call's shapes."""
    args = refill.args(None, [], [], q.batch)
    blank = jax.eval_shape(functools.partial(_prefill_rows, **refill.statics), *args[:2], *args[4:])
    state = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), blank)
    for size in refill_sizes(q.batch):
        compile_program(refill.fn, refill.statics, refill.args(state, [], [], size))
    zero = np.zeros((q.batch,), np.int32)
    compile_program(
        program.fn,
        program.statics,
        program.args(state, rows.keys, rows.slots, zero, np.zeros((q.batch,), bool)),
    )
    return state


def _refill_free_rows(q: Queue, refill: _Program, rows: Rows, tally: Tally, state, nxt: int):
    """Idle rows get the next pending prompts (one refill program); returns (state, the
    next pending prompt)."""
    free = np.nonzero(rows.prompt < 0)[0]
    take = min(len(free), q.n - nxt)
    if not take:
        return state, nxt
    ids = list(range(nxt, nxt + take))
    fill = free[:take]
    if tally.refills == 0:  # the first fill sets every row (idle ones to a dummy)
        fill, size = np.arange(q.batch), q.batch
    else:
        size = next(s for s in refill_sizes(q.batch) if s >= take)
    state, secs = run_program(refill.fn, refill.statics, refill.args(state, fill, ids, size))
    tally.seconds += secs
    tally.refill_seconds += secs
    tally.refills += 1
    rows.assign(q, fill[:take], ids)
    return state, nxt + take


def _finish_rows(q: Queue, rows: Rows, tally: Tally, live, tokens, c) -> None:
    """After a chunk: each live row's counters added to its prompt's; a row whose prompt
    reached its budget or a stop token hands its tokens over and goes idle."""
    for r in np.nonzero(live)[0]:
        p = rows.prompt[r]
        if q.spec:
            tally.rounds[p] += c['rounds'][r]
            tally.from_draft[p] += c['from_draft'][r]
            tally.proposed[p] += c['proposed'][r]
            tally.accepted[p] += c['accepted'][r]
        made = rows.length[r] - rows.start[r]
        if made >= q.budgets[p] or (made > 0 and q.stop_table[tokens[r, rows.length[r] - 1]]):
            tally.out[p] = tokens[r, rows.start[r] : rows.length[r]].tolist()
            rows.prompt[r] = -1


def _serve(q: Queue, refill: _Program, program: _Program, rows: Rows, state) -> ContinuousResult:
    """Refill and chunk until every prompt is served (the module docstring)."""
    tally = Tally.zeros(q.n, len(q.drafters))
    nxt = 0
    t0 = time.perf_counter()
    while True:
        state, nxt = _refill_free_rows(q, refill, rows, tally, state, nxt)
        live = rows.prompt >= 0
        if not live.any():
            break
        (state, counters), secs = run_program(
            program.fn,
            program.statics,
            program.args(state, rows.keys, rows.slots, rows.budget_left(q, live), live),
        )
        tally.seconds += secs
        tally.chunks += 1
        host = jax.device_get(dict(tokens=state.tokens, length=state.length, counters=counters))
        rows.length[:] = host['length']
        _finish_rows(q, rows, tally, live, host['tokens'], host['counters'])
    wall = time.perf_counter() - t0
    committed = np.array([len(t) for t in tally.out], np.int64)
    rounds = tally.rounds if q.spec else committed.copy()
    return ContinuousResult(
        tokens=tally.out,
        rounds=rounds,
        committed=committed,
        from_draft=tally.from_draft,
        proposed=tally.proposed,
        accepted=tally.accepted,
        chunks=tally.chunks,
        refills=tally.refills,
        programs=len(refill_sizes(q.batch)) + 1,
        seconds=tally.seconds,
        wall_seconds=wall,
        refill_seconds=tally.refill_seconds,
    )
