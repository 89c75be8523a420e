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
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax.engine.decode import (Counters, DecodeState, EngineState, consume_width,
                                   round_budget, speculative_round)
from specjax.engine.generate import ar_loop, check_slots, drafter_capacity
from specjax.engine.prefill import prefill_cache
from specjax.engine.programs import check_finite, compile_program, run_program
from specjax.engine.spec import DrafterData, DrafterSpec, EngineConfig, validate_drafter
from specjax.errors import ConfigError
from specjax.verify.rules import COUPLED_RULES

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

_REFILL_STATICS = ("verifier", "drafter_lms", "buf_len", "v_cap", "d_caps")


def _prefill_rows(v_params, d_params, prompt, prompt_len, d_prompts, d_prompt_len, *,
                  verifier, drafter_lms, buf_len, v_cap, d_caps) -> EngineState:
    """The state of R fresh rows, as the static engine's prefill makes it."""
    r = prompt.shape[0]
    vcache, _ = prefill_cache(verifier, v_params, prompt, prompt_len - 1, v_cap)
    dcaches, dlogits = [], []
    for lm, params, dp, dl, cap in zip(drafter_lms, d_params, d_prompts, d_prompt_len,
                                       d_caps):
        c, lg = prefill_cache(lm, params, dp, dl, cap)
        dcaches.append(c)
        dlogits.append(lg)
    tokens = jnp.zeros((r, buf_len), jnp.int32).at[:, :prompt.shape[1]].set(prompt)
    return EngineState(tokens=tokens, length=prompt_len, vcache=vcache,
                       dcaches=tuple(dcaches),
                       dsynced=jnp.broadcast_to(prompt_len, (len(drafter_lms), r)),
                       dlogits=tuple(dlogits))


@functools.partial(jax.jit, static_argnames=_REFILL_STATICS, donate_argnames=("state",))
def _refill(v_params, d_params, state, idx, prompt, prompt_len, d_prompts, d_prompt_len, *,
            verifier, drafter_lms, buf_len, v_cap, d_caps):
    fresh = _prefill_rows(v_params, d_params, prompt, prompt_len, d_prompts, d_prompt_len,
                          verifier=verifier, drafter_lms=drafter_lms, buf_len=buf_len,
                          v_cap=v_cap, d_caps=d_caps)
    return state.set_rows(idx, fresh)


@functools.partial(jax.jit, static_argnames=("cfg", "verifier", "drafters"),
                   donate_argnames=("carry",))
def _spec_chunk(v_params, d_data, slots, stop_table, v_temperature, max_new, chunk, carry,
                row_keys, *, cfg, verifier, drafters):
    """`chunk` rounds of every row with budget left (`max_new` i32[B], 0 for an idle row),
    fewer for a row that finishes; the loop ends when every row is done."""
    b = carry.tokens.shape[0]
    gamma = max(d.window(cfg.gamma) for d in drafters)
    state = DecodeState(
        tokens=carry.tokens, length=carry.length, start=carry.length,
        done=jnp.zeros((b,), bool), row_keys=row_keys, vcache=carry.vcache,
        dcaches=carry.dcaches, dsynced=carry.dsynced, dlogits=carry.dlogits,
        counters=Counters.zeros(b, len(drafters), gamma))
    state = state.replace(done=round_budget(cfg, state, max_new, gamma) <= 0)

    def body(s):
        r = speculative_round(cfg, verifier, drafters, v_params, d_data, slots, stop_table, s,
                              v_temperature=v_temperature, max_new=max_new)
        # Every live row has run as many rounds as the others: they pause together.
        return r.replace(done=r.done | (r.counters.rounds >= chunk))

    state = jax.lax.while_loop(lambda s: ~jnp.all(s.done), body, state)
    c = state.counters
    return state.carry(), dict(rounds=c.rounds, from_draft=c.from_draft, proposed=c.proposed,
                               accepted=c.accepted)


@functools.partial(jax.jit, static_argnames=("verifier", "coupled", "top_k", "top_p"),
                   donate_argnames=("carry",))
def _ar_chunk(v_params, carry, row_keys, stop_table, active, temperature, max_new, *,
              verifier, coupled, top_k, top_p):
    """Up to `max_new` i32[B] tokens per active row (the chunk, cut to the budget left)."""
    out = ar_loop(verifier, v_params, carry, row_keys, stop_table, active, temperature,
                   max_new, coupled, top_k, top_p, return_state=True)
    return out['state'], {}


# ----------------------------------------------------------------------------------------
# Validation (host, numpy only, before any work)
# ----------------------------------------------------------------------------------------

def _positive_int(field: str, value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigError(f"{field}: got {value!r}; allowed: an integer ≥ 1 ({what})")
    return int(value)


def _budgets(max_new_tokens, n: int) -> np.ndarray:
    if isinstance(max_new_tokens, (int, np.integer)) and not isinstance(max_new_tokens, bool):
        _positive_int("max_new_tokens", max_new_tokens, "new tokens per prompt")
        return np.full((n,), int(max_new_tokens), np.int64)
    values = list(max_new_tokens)
    if len(values) != n:
        raise ConfigError(f"max_new_tokens: got {len(values)} budgets for {n} prompts; "
                          "allowed: one integer, or one per prompt")
    for i, v in enumerate(values):
        _positive_int(f"max_new_tokens[{i}]", v, "new tokens for that prompt")
    return np.asarray(values, np.int64)


def _lengths(field: str, prompts, n: int) -> np.ndarray:
    if len(prompts) != n:
        raise ConfigError(f"{field}: got {len(prompts)} prompts; allowed: one per prompt ({n})")
    lens = np.array([len(p) for p in prompts], np.int64)
    if (lens < 1).any():
        i = int(np.argmin(lens))
        raise ConfigError(f"{field}[{i}]: got an empty prompt; allowed: ≥ 1 token")
    return lens


def _fits(field: str, model: str, lens, extra, max_len: int, what: str) -> None:
    """Every prompt's length + `extra` (its budget and a block) within `max_len`."""
    need = lens + extra
    if (need > max_len).any():
        i = int(np.argmax(need > max_len))
        raise ConfigError(f"{field}[{i}]: got {int(lens[i])} tokens, needing {int(need[i])} "
                          f"positions with {what}; allowed: ≤ {model} max_len = {max_len}")


def _width(lens, bucket: int, max_len: int) -> int:
    """Padded prompt width: the longest, rounded up to `bucket`, within the context."""
    longest = int(lens.max())
    return max(longest, min(-(-longest // bucket) * bucket, max_len))


def _pad(prompts, ids, width: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Prompts `ids` right-padded into (i32[rows, width], i32[rows]); spare rows hold a
    one-token dummy prompt."""
    arr = np.zeros((rows, width), np.int32)
    lens = np.ones((rows,), np.int32)
    for j, i in enumerate(ids):
        p = prompts[i]
        arr[j, :len(p)] = p
        lens[j] = len(p)
    return arr, lens


# ----------------------------------------------------------------------------------------
# The serve loop
# ----------------------------------------------------------------------------------------

def continuous_generate(cfg: EngineConfig, verifier, v_params, prompts: Sequence[Sequence[int]],
                        row_keys, *, batch: int, chunk: int,
                        max_new_tokens: int | Sequence[int] | None = None,
                        drafters: Sequence[DrafterSpec] | None = None,
                        d_data: Sequence[DrafterData] | None = None,
                        drafter_prompts: Sequence[Sequence[Sequence[int]]] | None = None,
                        slots: np.ndarray | None = None, stop_table: np.ndarray | None = None,
                        bucket: int = 1) -> ContinuousResult:
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
    batch = _positive_int("batch", batch, "rows served at once")
    chunk = _positive_int("chunk", chunk, "rounds per row per chunk")
    bucket = _positive_int("bucket", bucket, "prompt widths are rounded up to a multiple")
    n = len(prompts)
    if n < 1:
        raise ConfigError("prompts: got an empty queue; allowed: ≥ 1 prompt")
    plens = _lengths("prompts", prompts, n)
    budgets = _budgets(cfg.max_new_tokens if max_new_tokens is None else max_new_tokens, n)
    row_keys = np.asarray(row_keys)
    if row_keys.ndim < 1 or row_keys.shape[0] != n:
        raise ConfigError(f"row_keys: got shape {row_keys.shape}; allowed: one key per "
                          f"prompt ({n} rows)")
    if stop_table is None:
        stop_table = np.zeros((verifier.vocab_size,), bool)
    stop_table = np.asarray(stop_table, bool)
    if stop_table.shape != (verifier.vocab_size,):
        raise ConfigError(f"stop_table: got shape {stop_table.shape}; allowed: "
                          f"({verifier.vocab_size},), one flag per verifier token")
    spec = drafters is not None
    drafters = tuple(drafters or ())
    k = len(drafters)
    if spec:
        if k < 1:
            raise ConfigError("drafters: got none; allowed: ≥ 1 drafter, or None for the "
                              "verifier alone")
        for d in drafters:
            validate_drafter(d)
        d_data = tuple(d_data or ())
        if len(d_data) != k:
            raise ConfigError(f"d_data: got {len(d_data)} entries; allowed: one per drafter "
                              f"({k})")
        windows = [d.window(cfg.gamma) for d in (x.static for x in drafters)]
        gamma = max(windows)
        if cfg.n_slots > 1 and len(set(windows)) > 1:
            raise ConfigError(f"gamma: drafters {[d.name for d in drafters]} have γ {windows}"
                              f" with rule {cfg.rule!r} over {cfg.n_slots} slots; allowed: "
                              "equal γ for drafters that share a row")
        slots = check_slots(cfg, slots, n, k)
        if drafter_prompts is None or len(drafter_prompts) != k:
            raise ConfigError(f"drafter_prompts: need {k} lists of {n} prompts (one per "
                              "drafter)")
        for d, data in zip(drafters, d_data):
            if int(data.to_verifier.shape[0]) != d.lm.vocab_size:
                raise ConfigError(f"drafter {d.name!r} vocabulary: map covers "
                                  f"{data.to_verifier.shape[0]} ids, model has "
                                  f"{d.lm.vocab_size}; allowed: equal sizes")
        block = cfg.n_slots * gamma
        d_lens = [_lengths(f"drafter_prompts[{i}]", dp, n) for i, dp in enumerate(drafter_prompts)]
        for i, (d, data, lens, g) in enumerate(zip(drafters, d_data, d_lens, windows)):
            m = int(data.retok.shape[1])
            _fits(f"drafter_prompts[{i}]", f"drafter {d.name!r}", lens,
                  consume_width(m, g + 1) + g, d.lm.max_len, "one consume block")
    else:
        gamma, block, d_lens, windows = 0, 1, [], []
        d_data = ()
    _fits("prompts", "the verifier's", plens, budgets + block, verifier.max_len,
          f"its max_new_tokens and a block of {block}")
    check_finite("verifier", v_params)
    for d, data in zip(drafters, d_data):
        check_finite(f"drafter {d.name!r}", data.params)

    # Fixed shapes for the whole call.
    width = _width(plens, bucket, verifier.max_len)
    max_budget = int(budgets.max())
    if spec:
        buf_len = width + max_budget + gamma + 1
        v_cap = (buf_len - gamma - 1 if cfg.n_slots == 1
                 else buf_len + (cfg.n_slots - 1) * gamma)
    else:
        buf_len = width + max_budget + 1
        v_cap = buf_len - 1
    v_cap = min(v_cap, verifier.max_len)
    d_widths = [_width(lens, bucket, d.lm.max_len) for d, lens in zip(drafters, d_lens)]
    d_caps = tuple(drafter_capacity(d.lm, int(data.retok.shape[1]), w, width, buf_len, g)
                   for d, data, w, g in zip(drafters, d_data, d_widths, windows))
    refill_statics = dict(verifier=verifier, drafter_lms=tuple(d.lm for d in drafters),
                          buf_len=buf_len, v_cap=v_cap, d_caps=d_caps)
    d_params = tuple(data.params for data in d_data)

    def refill_args(state, rows, ids, size):
        idx = np.full((size,), batch, np.int32)        # ≥ B: a padding row, dropped
        idx[:len(rows)] = rows
        arr, lens = _pad(prompts, ids, width, size)
        d_arr, d_len = zip(*[_pad(dp, ids, w, size) for dp, w in zip(drafter_prompts, d_widths)]
                           ) if spec else ((), ())
        dev = jax.device_put(dict(idx=idx, prompt=arr, prompt_len=lens, d_prompts=tuple(d_arr),
                                  d_prompt_len=tuple(d_len)))
        return (v_params, d_params, state, dev['idx'], dev['prompt'], dev['prompt_len'],
                dev['d_prompts'], dev['d_prompt_len'])

    if spec:
        cfg_static = dataclasses.replace(cfg, verifier_temperature=1.0, max_new_tokens=1)
        chunk_fn = _spec_chunk
        chunk_statics = dict(cfg=cfg_static, verifier=verifier,
                             drafters=tuple(d.static for d in drafters))
        temps = tuple(np.float32(d.temperature) for d in drafters)
        fixed = jax.device_put(dict(stop_table=stop_table, temps=temps,
                                    v_temperature=np.float32(cfg.verifier_temperature),
                                    chunk=np.int32(chunk)))
        d_data = tuple(data.replace(temperature=t) for data, t in zip(d_data, fixed['temps']))

        def chunk_args(state, keys, row_slots, max_new, live):
            dev = jax.device_put(dict(keys=keys, slots=row_slots, max_new=max_new))
            return (v_params, d_data, dev['slots'], fixed['stop_table'],
                    fixed['v_temperature'], dev['max_new'], fixed['chunk'], state,
                    dev['keys'])
    else:
        chunk_fn = _ar_chunk
        chunk_statics = dict(verifier=verifier, coupled=cfg.rule in COUPLED_RULES,
                             top_k=cfg.verifier_top_k, top_p=cfg.verifier_top_p)
        fixed = jax.device_put(dict(stop_table=stop_table,
                                    temperature=np.float32(cfg.verifier_temperature)))

        def chunk_args(state, keys, row_slots, max_new, live):
            del row_slots
            dev = jax.device_put(dict(keys=keys, active=live,
                                      max_new=np.minimum(max_new, chunk).astype(np.int32)))
            return (v_params, state, dev['keys'], fixed['stop_table'], dev['active'],
                    fixed['temperature'], dev['max_new'])

    # Host mirrors of the rows: which prompt each serves (-1: idle), its key, slots, start.
    row_prompt = np.full((batch,), -1, np.int64)
    row_start = np.ones((batch,), np.int64)
    row_len = np.ones((batch,), np.int64)
    row_keys_b = np.zeros((batch,) + row_keys.shape[1:], row_keys.dtype)
    row_keys_b[:] = row_keys[0]
    row_slots = (np.tile(slots[0], (batch, 1)) if spec
                 else np.zeros((batch, 1), np.int32))

    # Every program of the call, compiled before the clock starts (a refill pads its rows
    # to one of `refill_sizes(batch)`).
    sizes = refill_sizes(batch)
    args = refill_args(None, [], [], batch)
    blank = jax.eval_shape(functools.partial(_prefill_rows, **refill_statics),
                           *args[:2], *args[4:])
    state = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), blank)
    for size in sizes:
        compile_program(_refill, refill_statics, refill_args(state, [], [], size))
    zero = np.zeros((batch,), np.int32)
    compile_program(chunk_fn, chunk_statics, chunk_args(state, row_keys_b, row_slots, zero,
                                                 np.zeros((batch,), bool)))

    out: list = [None] * n
    rounds = np.zeros((n,), np.int64)
    from_draft = np.zeros((n,), np.int64)
    proposed = np.zeros((n, k), np.int64)
    accepted = np.zeros((n, k), np.int64)
    seconds, refill_seconds, chunks, refills, nxt = 0.0, 0.0, 0, 0, 0
    t0 = time.perf_counter()
    while True:
        free = np.nonzero(row_prompt < 0)[0]
        take = min(len(free), n - nxt)
        if take:
            ids = list(range(nxt, nxt + take))
            rows = free[:take]
            if refills == 0:      # the first fill sets every row (idle ones to a dummy)
                rows, size = np.arange(batch), batch
            else:
                size = next(s for s in sizes if s >= take)
            state, secs = run_program(_refill, refill_statics, refill_args(state, rows, ids, size))
            seconds += secs
            refill_seconds += secs
            refills += 1
            rows = rows[:take]
            row_prompt[rows] = ids
            row_start[rows] = plens[ids]
            row_len[rows] = plens[ids]
            row_keys_b[rows] = row_keys[ids]
            if spec:
                row_slots[rows] = slots[ids]
            nxt += take
        live = row_prompt >= 0
        if not live.any():
            break
        left = np.where(live, budgets[np.maximum(row_prompt, 0)] - (row_len - row_start), 0)
        (state, counters), secs = run_program(chunk_fn, chunk_statics,
                                       chunk_args(state, row_keys_b, row_slots,
                                                  left.astype(np.int32), live))
        seconds += secs
        chunks += 1
        host = jax.device_get(dict(tokens=state.tokens, length=state.length,
                                   counters=counters))
        tokens, row_len[:] = host['tokens'], host['length']
        c = host['counters']
        for r in np.nonzero(live)[0]:
            p = row_prompt[r]
            if spec:
                rounds[p] += c['rounds'][r]
                from_draft[p] += c['from_draft'][r]
                proposed[p] += c['proposed'][r]
                accepted[p] += c['accepted'][r]
            made = row_len[r] - row_start[r]
            if made >= budgets[p] or (made > 0 and stop_table[tokens[r, row_len[r] - 1]]):
                out[p] = tokens[r, row_start[r]:row_len[r]].tolist()
                row_prompt[r] = -1
    wall = time.perf_counter() - t0
    committed = np.array([len(t) for t in out], np.int64)
    if not spec:
        rounds = committed.copy()
    return ContinuousResult(tokens=out, rounds=rounds, committed=committed,
                            from_draft=from_draft, proposed=proposed, accepted=accepted,
                            chunks=chunks, refills=refills, programs=len(sizes) + 1,
                            seconds=seconds, wall_seconds=wall,
                            refill_seconds=refill_seconds)
