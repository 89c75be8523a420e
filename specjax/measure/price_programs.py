"""What the machine prices of rounds and state programs time (`specjax.measure.prices`).

A run's forwards are priced by shape (`specjax.measure.timing.forward_timer`). The rest of the work
its timed programs do is priced here, with the engine's own code:

* ``round`` keys: one loop trip of a speculative call (`engine.decode.speculative_round`)
  or of the autoregressive loop (`engine.autoregressive.ar_step`) with every model made free: a
  `FreeLM` returns constant logits (a peak on one token that stops no row) and the cache
  it was given, while the cache bookkeeping (advance, rollback, compaction along the
  accepted path) stays the model's own. What a trip then costs is the round without its
  forwards: the noise or uniforms over the vocabulary, the sampling distributions, the
  rule, the counters, the commit.
* ``state`` keys: one run of a carried-state program (gather, commit, place a drafter's
  prefill: `specjax.policy.plan_state`) — the very compiled executable, on arguments of the
  same shapes.

The callers register a template when they run a program (`register_round`,
`register_ar_round`, `register_state`), which returns the work's price key; `time_key`
times a registered key. A template keeps the call's shapes and its integer arrays
(lengths, token buffers, row indices) and its small arrays (temperatures), never its
floating-point arrays: zeros of their shape and sharding are timed, since none of this work
depends on the values, and no template keeps a model's weights alive.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from specjax.engine import generate as gen
from specjax.engine.autoregressive import ar_step
from specjax.engine.generate import decode_state, round_body
from specjax.engine.programs import compile_program
from specjax.engine.spec import widest_chain
from specjax.metrics import price_key
from specjax.models.cache import block_rows

__all__ = [
    "FreeLM",
    "register_round",
    "register_ar_round",
    "register_state",
    "time_key",
]

#: Largest integer array a template keeps by value (larger ones are timed as zeros).
_KEEP_INTS = 1 << 20
#: Arrays of any dtype up to this size are kept by value too (temperatures, scalars).
_KEEP_SMALL = 4096
#: price key → a function that builds a timer (each call of the timer: seconds per unit).
_TEMPLATES: dict[str, Callable[[], Callable[[], float]]] = {}


@dataclasses.dataclass(frozen=True)
class FreeLM:
    """`inner` with a free forward: constant logits of `inner`'s shape and dtype, peaked at
    token `peak`, plus a negligible term in the input tokens (so that no loop hoists
    them); the cache comes back as it was given. Everything else is `inner`'s."""

    inner: Any
    peak: int

    def __getattr__(self, name):
        if name in ("inner", "peak"):
            raise AttributeError(name)
        return getattr(self.inner, name)

    def forward(self, params, cache, tokens, positions, block_mask, logits_at=None):
        abstract = lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x))
        out = jax.eval_shape(
            self.inner.forward,
            *jax.tree.map(abstract, (params, cache, tokens, positions, block_mask)),
        )[0]
        if logits_at is not None:
            tokens = block_rows(tokens, logits_at)
            out = jax.ShapeDtypeStruct(tokens.shape + out.shape[-1:], out.dtype)
        base = jnp.zeros(out.shape[-1:], out.dtype).at[self.peak].set(30.0)
        wiggle = (tokens % 2).astype(out.dtype)[..., None] * 1e-3
        return jnp.broadcast_to(base, out.shape) + wiggle, cache

    def forward_hidden(
        self, params, cache, tokens, positions, block_mask, logits_at=None, layers=None
    ):
        """`forward`'s free logits with free hidden states of `inner`'s shape: a round with
        feature drafters asks the verifier for its states, and that forward is priced
        apart (its ``verify`` key), not again inside the round's own price."""
        abstract = lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x))
        kw = {} if layers is None else {"layers": layers}
        hidden = jax.eval_shape(
            functools.partial(self.inner.forward_hidden, **kw),
            *jax.tree.map(abstract, (params, cache, tokens, positions, block_mask)),
        )[1]
        logits, cache = self.forward(params, cache, tokens, positions, block_mask, logits_at)
        wiggle = (tokens % 2).astype(hidden.dtype)[..., None] * 1e-3
        return logits, jnp.broadcast_to(wiggle, hidden.shape), cache


# ----------------------------------------------------------------------------------------
# Templates: shapes and integer arrays kept, floating-point arrays rebuilt as zeros
# ----------------------------------------------------------------------------------------


def _sharding(x):
    """The sharding an array was placed with; None for host values and for uncommitted
    arrays (jit places those as the program wants, so their rebuilt copies must be
    uncommitted too: committed to one device, a program compiled over a mesh refuses
    them)."""
    if not isinstance(x, jax.Array) or not getattr(x, "committed", True):
        return None
    return getattr(x, "sharding", None)


def _snap(x):
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        return x
    n = int(np.prod(x.shape))
    exact = jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == bool
    if n <= _KEEP_SMALL or (exact and n <= _KEEP_INTS):
        return (np.asarray(x), _sharding(x))
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=_sharding(x))


def _snap_tree(tree):
    return jax.tree.map(_snap, tree)


def _is_kept(x) -> bool:
    return isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], np.ndarray)


def _rebuild(snap):
    def one(x):
        if _is_kept(x):
            arr, sh = x
            return jax.device_put(arr, sh) if sh is not None else jnp.asarray(arr)
        if isinstance(x, jax.ShapeDtypeStruct):
            z = np.zeros(x.shape, x.dtype)
            return jax.device_put(z, x.sharding) if x.sharding is not None else jnp.asarray(z)
        return x

    return jax.tree.map(
        one, snap, is_leaf=lambda x: _is_kept(x) or isinstance(x, jax.ShapeDtypeStruct)
    )


def _signature(*parts) -> str:
    """A short digest of static parts and of the shapes, dtypes and shardings of arrays."""

    def leaf(x):
        if hasattr(x, "shape") and hasattr(x, "dtype"):
            return ("array", tuple(x.shape), str(x.dtype), str(_sharding(x)))
        return repr(x)

    flat = []
    for p in parts:
        leaves, tree = jax.tree.flatten(p)
        flat.append((str(tree), tuple(leaf(x) for x in leaves)))
    return hashlib.sha256(repr(flat).encode()).hexdigest()[:10]


def _peak(stop_table) -> int:
    """A token that stops no row (the free models' peak), 0 if every token stops."""
    free = np.flatnonzero(~np.asarray(stop_table, bool))
    return int(free[0]) if free.size else 0


def _timer(fn, args: tuple, per: int):
    """`fn(*args)` compiled ahead of time and run once (warm); each call of the returned
    function runs it again and returns its seconds ÷ `per`."""
    exe = fn.lower(*args).compile()
    jax.block_until_ready(exe(*args))

    def run() -> float:
        t0 = time.perf_counter()
        jax.block_until_ready(exe(*args))
        return (time.perf_counter() - t0) / per

    return run


def time_key(key: str, repeats: int = 3) -> float:
    """Seconds of one unit of the registered work `key` (the minimum over `repeats`)."""
    make = _TEMPLATES.get(key)
    if make is None:
        raise ValueError(
            f"price key: no template for {key!r} in this process; allowed: round and state "
            "keys of programs this process ran (specjax.measure.price_programs)"
        )
    run = make()
    return min(run() for _ in range(max(int(repeats), 1)))


# ----------------------------------------------------------------------------------------
# Speculative rounds
# ----------------------------------------------------------------------------------------


def _round_loop(
    v_params, d_data, slots, stop_table, v_temperature, max_new, carry, row_keys, *, cfg,
    verifier, drafters, reps,
):  # fmt: skip
    state = decode_state(cfg, drafters, carry, row_keys, max_new)
    body = round_body(
        cfg, verifier, drafters, v_params, d_data, slots, stop_table, v_temperature, max_new
    )
    # Every trip runs every row (a row the budget ended is live again): the program's
    # work does not depend on it, and nothing is left for the loop to skip.
    return jax.lax.fori_loop(
        0, reps, lambda _, s: body(s.replace(done=jnp.zeros_like(s.done))), state
    )


def register_round(
    cfg, verifier, v_params, drafters, d_data, state, row_keys, stop_table, capacity: int
) -> str:
    """The ``round`` price key of a speculative call continuing `state` (the arguments of
    `engine.generate.speculative_generate`; `capacity`: the verifier cache's, as in its
    forwards' keys), its template registered on first sight."""

    statics = gen._spec_statics(  # pylint: disable=protected-access
        cfg, verifier, drafters, True, d_data
    )
    gamma = widest_chain(cfg.gamma, statics["drafters"])
    rows = int(state.tokens.shape[0])
    sig = _signature(statics, state, row_keys, d_data)
    names = "+".join(f"{d.name}{d.static.own_gamma(cfg.gamma)}" for d in drafters)
    key = price_key("round", f"{cfg.rule}.{names}.{sig}", 1 + cfg.n_slots * gamma, rows, capacity)
    if key in _TEMPLATES:
        return key
    # Shapes and integer arrays only: a template never keeps a model's weights alive (the
    # free models read none of them; zeros of their shapes are timed).
    snap, keys_np = _snap_tree(state), np.asarray(row_keys)
    v_snap, d_snap = _snap_tree(v_params), _snap_tree(tuple(d_data))
    stop = (
        np.zeros((verifier.vocab_size,), bool)
        if stop_table is None
        else np.asarray(stop_table, bool)
    )

    def make():
        v_params, d_data = _rebuild(v_snap), _rebuild(d_snap)
        peak = _peak(stop)
        free_v = FreeLM(verifier, peak)
        free_d = []
        for spec, data in zip(drafters, d_data):
            fv = np.asarray(data.from_verifier)
            d_peak = int(fv[peak]) if peak < fv.size and fv[peak] >= 0 else 0
            free_d.append(dataclasses.replace(spec, lm=FreeLM(spec.lm, d_peak)))
        host = gen._host_inputs(  # pylint: disable=protected-access
            cfg, free_v, v_params, free_d, d_data, rows, keys_np, None, stop
        )
        st = gen._spec_statics(cfg, free_v, free_d, True)  # pylint: disable=protected-access
        # The rebuilt arrays are new objects: the twins the call shares are carried over.
        st["drafters"] = tuple(
            dataclasses.replace(d, shares=o.shares)
            for d, o in zip(st["drafters"], statics["drafters"])
        )
        dev, head = gen._device_inputs(host, v_params, d_data)  # pylint: disable=protected-access
        reps = 4
        fn = jax.jit(
            functools.partial(
                _round_loop, cfg=st["cfg"], verifier=free_v, drafters=st["drafters"], reps=reps
            )
        )
        return _timer(fn, head + (_rebuild(snap), dev["row_keys"]), reps)

    _TEMPLATES[key] = make
    return key


# ----------------------------------------------------------------------------------------
# The autoregressive loop
# ----------------------------------------------------------------------------------------


def _ar_loop(
    v_params, carry, row_keys, stop_table, temperature, max_new, *, verifier, coupled, top_k,
    top_p, reps,
):  # fmt: skip
    step = functools.partial(
        ar_step,
        verifier,
        v_params,
        row_keys,
        stop_table,
        temperature,
        max_new,
        carry.length,
        coupled=coupled,
        top_k=top_k,
        top_p=top_p,
    )
    c = (carry.tokens, carry.length, jnp.zeros(carry.length.shape, bool), carry.vcache)
    return jax.lax.fori_loop(
        0, reps, lambda _, c: step((c[0], c[1], jnp.zeros_like(c[2]), c[3])), c
    )


def register_ar_round(
    verifier, v_params, state, row_keys, stop_table, capacity: int, *, coupled, top_k=0, top_p=1.0
) -> str:
    """The ``round`` price key of one step of the autoregressive loop continuing `state`
    (`engine.autoregressive.autoregressive_generate`; `capacity`: the verifier cache's), its
    template registered on first sight."""
    rows = int(state.tokens.shape[0])
    statics = (bool(coupled), int(top_k), float(top_p), verifier)
    sig = _signature(statics, state.tokens, state.length, state.vcache, row_keys)
    key = price_key("round", f"ar.{sig}", 1, rows, capacity)
    if key in _TEMPLATES:
        return key
    snap = _snap_tree(state.replace(dcaches=(), dlogits=(), dsynced=state.dsynced[:0]))
    v_snap = _snap_tree(v_params)
    keys_np = np.asarray(row_keys)
    stop = (
        np.zeros((verifier.vocab_size,), bool)
        if stop_table is None
        else np.asarray(stop_table, bool)
    )

    def make():
        free_v = FreeLM(verifier, _peak(stop))
        reps = 8
        fn = jax.jit(
            functools.partial(
                _ar_loop,
                verifier=free_v,
                coupled=bool(coupled),
                top_k=int(top_k),
                top_p=float(top_p),
                reps=reps,
            )
        )
        args = (
            _rebuild(v_snap),
            _rebuild(snap),
            jnp.asarray(keys_np),
            jnp.asarray(stop),
            jnp.float32(1.0),
            jnp.int32(1 << 20),
        )
        return _timer(fn, args, reps)

    _TEMPLATES[key] = make
    return key


# ----------------------------------------------------------------------------------------
# State programs
# ----------------------------------------------------------------------------------------


def register_state(fn, statics: dict, args: tuple, rows: int, capacity: int) -> str:
    """The ``state`` price key of one run of the compiled program `fn(*args, **statics)`
    (`engine.programs.run_program`), its template registered on first sight (call it
    before the program runs: a program may donate its arguments)."""
    name = getattr(fn, "__name__", None) or getattr(
        getattr(fn, "__wrapped__", None), "__name__", "program"
    )
    sig = _signature(tuple(sorted(statics.items())), args)
    key = price_key(
        "state", f"{name.lstrip('_')}.{sig}", 1, max(int(rows), 1), max(int(capacity), 1)
    )
    if key in _TEMPLATES:
        return key
    snap = _snap_tree(args)

    def make():

        exe = compile_program(fn, statics, _rebuild(snap))
        jax.block_until_ready(exe(*_rebuild(snap)))  # warm

        def run() -> float:
            a = _rebuild(snap)  # fresh arguments: the program may donate them
            jax.block_until_ready(a)
            t0 = time.perf_counter()
            jax.block_until_ready(exe(*a))
            return time.perf_counter() - t0

        return run

    _TEMPLATES[key] = make
    return key
