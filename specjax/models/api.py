"""The functional LM API (see ARCHITECTURE.md) and its Flax transformer implementation.

Every model the engine drives is a frozen, hashable dataclass, passed to ``jax.jit`` as a
static argument, with pure methods over a plain ``params`` pytree and a :class:`Cache`::

    lm = TransformerLM(TransformerConfig(...))
    params = lm.init_params(jax.random.key(0))        # nested dict of arrays
    cache = lm.init_cache(batch)                       # length == 0
    logits, cache = lm.forward(params, cache, tokens, positions, block_mask)
    cache = advance(cache, n)                          # commit

``forward`` writes the block at slots ``[length, length+T)``, lets block token ``t``
attend to slots ``< length`` and to block tokens ``s`` with ``block_mask[b, t, s]``, and
does not move ``length``. Rotary positions are the caller's responsibility: a chain
continuing a row of ``length`` committed tokens uses ``length + arange(T)``; a tree node at
depth ``d`` uses ``length + d``. ``block_mask[b, t, t]`` must be True.

Capacity: ``T > max_len`` raises before any work; ``length + T > max_len`` cannot be
checked under ``jit`` (it is data) and is the caller's responsibility (see ``cache.py``
for what happens then: the overflowing slots are dropped, never wrapped).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, Protocol

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax.models.cache import (
    Cache,
    advance,
    block_rows,
    compact,
    init_cache,
    rollback,
    table_values,
)
from specjax.models.drafter_kind import DrafterKind, QSupport, register
from specjax.models.fused import fuse_params, order_params
from specjax.models.transformer import Transformer, TransformerConfig, scale_noise
from specjax.runtime import sharding as shd

__all__ = [
    'LM',
    'Cache',
    'TransformerLM',
    'TransformerConfig',
    'TRANSFORMER',
    'advance',
    'rollback',
    'compact',
    'causal_block_mask',
    'count_params',
    'forward_rows',
    'embedding_table',
]


class LM(Protocol):
    vocab_size: int
    max_len: int

    def init_cache(self, batch: int, capacity: int | None = None) -> Cache: ...

    def forward(self, params, cache: Cache, tokens, positions, block_mask) -> tuple[Any, Cache]: ...

    # Optional: ``forward(..., logits_at=i32[B, R])`` returns the logits of those block
    # positions only, [B, R, V] (`forward_rows` falls back to slicing full logits).

    # Commit helpers (the module-level functions below, for a `Cache`).
    def advance(self, cache, n): ...

    def rollback(self, cache, new_length): ...

    def compact(self, cache, src, n): ...


def takes_logits_at(method) -> bool:
    """Whether an LM's ``forward`` (or ``forward_hidden``) takes ``logits_at``."""
    try:
        return 'logits_at' in inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False


def forward_rows(lm, params, cache, tokens, positions, block_mask, at, with_hidden=False):
    """``lm.forward`` (``forward_hidden`` with ``with_hidden``) keeping only the logits of
    block positions ``at: i32[B, R]``: (logits f32[B, R, V], [hidden,] cache). An LM whose
    forward takes ``logits_at`` runs its head on those rows only; any other LM is sliced."""
    method = lm.forward_hidden if with_hidden else lm.forward
    # A tuple: the states a multi-state feature drafter reads (`forward_hidden`'s layers).
    layers = {'layers': with_hidden} if isinstance(with_hidden, tuple) else {}
    if takes_logits_at(method):
        return method(params, cache, tokens, positions, block_mask, logits_at=at, **layers)
    out = method(params, cache, tokens, positions, block_mask, **layers)
    return (block_rows(out[0], at),) + tuple(out[1:])


def causal_block_mask(batch: int, block: int) -> jax.Array:
    """bool[B, T, T]: token t sees block tokens s <= t (a chain)."""
    m = jnp.tril(jnp.ones((block, block), jnp.bool_))
    return jnp.broadcast_to(m, (batch, block, block))


def count_params(params) -> int:
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))


@dataclasses.dataclass(frozen=True)
class TransformerLM:
    """The Flax transformer behind the functional LM API.

    Equality and hash are the config's: the nnx GraphDef (``graphdef``) and the abstract
    parameter state are derived from it once, at construction.
    """

    config: TransformerConfig
    graphdef: Any = dataclasses.field(init=False, compare=False, hash=False, repr=False)
    _abstract_state: Any = dataclasses.field(init=False, compare=False, hash=False, repr=False)

    def __post_init__(self):
        if not isinstance(self.config, TransformerConfig):
            raise ValueError(
                f'TransformerLM.config: expected a TransformerConfig, '
                f'got {type(self.config).__name__}'
            )
        abstract = nnx.eval_shape(lambda: Transformer(self.config, rngs=nnx.Rngs(0)))
        graphdef, state = nnx.split(abstract)
        object.__setattr__(self, 'graphdef', graphdef)
        object.__setattr__(self, '_abstract_state', state)

    # -- static facts ---------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def max_len(self) -> int:
        return self.config.max_len

    def abstract_params(self):
        """The params pytree as ``jax.ShapeDtypeStruct`` leaves (for restoring)."""
        return nnx.to_pure_dict(self._abstract_state)

    def param_logical_axes(self):
        """The params pytree with each leaf replaced by its tuple of logical axis names."""
        return nnx.to_pure_dict(self._abstract_state, extract_fn=_logical_axes_of)

    # -- state ----------------------------------------------------------------------------
    def init_params(self, rng) -> dict:
        """Fresh parameters (a nested dict of arrays) from a PRNG key or an int seed."""
        if isinstance(rng, (int, np.integer)):
            rng = jax.random.key(int(rng))
        return _init_params(self, rng)

    def init_cache(self, batch: int, capacity: int | None = None) -> Cache:
        """An empty cache of ``capacity`` slots per row (default ``max_len``).

        Attention reads every slot of the cache, so its cost follows the capacity: size
        it to what the caller will fill (the engine uses prompt width + new tokens +
        one block), not to the model's context.
        """
        c = self.config
        capacity = c.max_len if capacity is None else int(capacity)
        if not 1 <= capacity <= c.max_len:
            raise ValueError(
                f'TransformerLM.init_cache: capacity={capacity} (allowed: '
                f'1 <= capacity <= max_len={c.max_len})'
            )
        return init_cache(c.n_layers, batch, capacity, c.n_kv_heads, c.head_dim, jnp.dtype(c.dtype))

    # The cache helpers as methods, so an engine can commit any LM's cache (the synthetic
    # LMs keep a cache of another type) without knowing which kind of model it holds.
    def advance(self, cache: Cache, n) -> Cache:
        return advance(cache, n)

    def rollback(self, cache: Cache, new_length) -> Cache:
        return rollback(cache, new_length)

    def compact(self, cache: Cache, src, n) -> Cache:
        return compact(cache, src, n)

    # -- compute --------------------------------------------------------------------------
    def _module(self, params) -> Transformer:
        return nnx.merge(self.graphdef, nnx.State(params))

    def forward(self, params, cache: Cache, tokens, positions, block_mask, logits_at=None):
        """Scores a block against the cache.

        Args:
          params: from :meth:`init_params` (or restored).
          cache: the row caches; ``cache.length`` i32[B] committed slots.
          tokens: i32[B, T]; positions: i32[B, T] rotary positions (caller's choice).
          block_mask: bool[B, T, T], ``[b, t, s]``: block token t sees block token s.
          logits_at: i32[B, R] block positions whose logits are wanted (None: all T); the
            head then runs on R rows, not T.

        Returns:
          (logits f32[B, T, V] (f32[B, R, V] with ``logits_at``), cache with the block
          written at ``[length, length+T)``; ``length`` unchanged).
        """
        B, T = tokens.shape
        if T > self.max_len:
            raise ValueError(
                f'TransformerLM.forward: block length T={T} exceeds the cache '
                f'capacity max_len={self.max_len} (allowed: 1 <= T <= {self.max_len})'
            )
        chex.assert_shape(positions, (B, T))
        chex.assert_shape(block_mask, (B, T, T))
        chex.assert_shape(cache.length, (B,))
        chex.assert_type([tokens, positions], int)
        logits, k, v = self._module(params)(
            tokens, positions, block_mask, cache.k, cache.v, cache.length, logits_at=logits_at
        )
        return logits, cache.replace(k=k, v=v)

    def forward_hidden(
        self, params, cache: Cache, tokens, positions, block_mask, logits_at=None, layers=None
    ):
        """`forward` that also returns the block's final-normed hidden states [B, T, D] (all
        T rows, whatever ``logits_at``): (logits, hidden, cache). The features a feature
        drafter reads (`specjax.models.eagle`). ``layers`` (a tuple of ints in [0,
        n_layers]; `check_layers`): those states concatenated instead, [B, T, n·D] — i <
        n_layers the residual stream after block i, n_layers the final-normed one."""
        B, T = tokens.shape
        if T > self.max_len:
            raise ValueError(
                f'TransformerLM.forward_hidden: block length T={T} exceeds the cache '
                f'capacity max_len={self.max_len} (allowed: 1 <= T <= {self.max_len})'
            )
        logits, k, v, hidden = self._module(params)(
            tokens,
            positions,
            block_mask,
            cache.k,
            cache.v,
            cache.length,
            with_hidden=True,
            logits_at=logits_at,
            hidden_layers=self.check_layers(layers),
        )
        return logits, hidden, cache.replace(k=k, v=v)

    def check_layers(self, layers):
        """``layers`` as a tuple of ints (None stays None); ValueError naming the field
        unless each lies in [0, n_layers]."""
        if layers is None:
            return None
        layers = tuple(int(i) for i in layers)
        L = self.config.n_layers
        if not layers or any(not 0 <= i <= L for i in layers):
            raise ValueError(
                f'TransformerLM: feature layers {layers} (allowed: a non-empty tuple of ints in '
                f'[0, {L}]; {L} is the final-normed state)'
            )
        return layers

    def hidden_full(self, params, tokens, layers=None) -> tuple[jax.Array, jax.Array]:
        """(causal logits f32[B, T, V], final-normed hidden states [B, T, D]) over whole
        sequences (a feature drafter's training targets); with ``layers`` the second item
        is those states concatenated, [B, T, n·D] (`forward_hidden`)."""
        B, T = tokens.shape
        if T > self.max_len:
            raise ValueError(
                f'TransformerLM.hidden_full: T={T} exceeds max_len={self.max_len} '
                f'(allowed: 1 <= T <= {self.max_len})'
            )
        positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
        logits, _, _, hidden = self._module(params)(
            tokens,
            positions,
            causal_block_mask(B, T),
            with_hidden=True,
            hidden_layers=self.check_layers(layers),
        )
        return logits, hidden

    def logits_full(self, params, tokens) -> jax.Array:
        """Causal logits f32[B, T, V] over whole sequences (training and evaluation)."""
        B, T = tokens.shape
        if T > self.max_len:
            raise ValueError(
                f'TransformerLM.logits_full: T={T} exceeds max_len={self.max_len} '
                f'(allowed: 1 <= T <= {self.max_len})'
            )
        chex.assert_type(tokens, int)
        positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
        logits, _, _ = self._module(params)(tokens, positions, causal_block_mask(B, T))
        return logits


def _transformer_example(verifier, lm, kept):
    """The drafter's own transformer as given, its weights abstract."""
    del verifier, kept
    return lm, lm.abstract_params()


#: A drafter with a model of its own over its vocabulary (`TransformerLM`, and any model of
#: the LM API whose class registers no kind: `specjax.models.drafter_kinds.DEFAULT`).
TRANSFORMER = register(
    DrafterKind(
        name='transformer',
        lm_type=TransformerLM,
        q_support=QSupport.DENSE,
        example=_transformer_example,
        summary='a transformer of its own: a dense law over its vocabulary',
    )
)


def fuse_projections(lm: TransformerLM, params, mesh=None, rules=None):
    """``(lm', params')``: the same model in the fused projection layout
    (``TransformerConfig.fused_projections``: q/k/v in one product, gate/up in one), the
    same logits up to the products' rounding. ``mesh`` / ``rules``: place each fused leaf
    on its shards (``specjax.runtime.sharding``: the fused q/k/v table splits over KV heads)."""
    new = TransformerLM(dataclasses.replace(lm.config, fused_projections=True))
    return new, fuse_params(lm.config, params, _placer(new, mesh, rules))


def embedding_table(lm: TransformerLM, params) -> jax.Array:
    """The input embedding table's values [V, D], however it is stored (a half-precision
    table only read by row may be held as its uint16 bits: `cache.table_bits`)."""
    return table_values(params['embed'], lm.config.param_dtype)


def order_weights(lm: TransformerLM, params, out_first: bool = True, mesh=None, rules=None):
    """``(lm', params')``: the same model with its projection weights stored output dims
    first (``out_first``, `TransformerConfig.out_first`: ``[out, in]``, products contract
    the weights' last dims) or back in the default ``[in, out]`` order; the same logits
    up to the products' rounding. ``mesh`` / ``rules``: as in `fuse_projections`."""
    new = TransformerLM(dataclasses.replace(lm.config, out_first=bool(out_first)))
    return new, order_params(lm.config, params, out_first, _placer(new, mesh, rules))


def _placer(lm: TransformerLM, mesh, rules):
    """``place(path, x)``: ``x`` put on its shards of ``lm``'s layout on ``mesh`` (None:
    no mesh)."""
    if mesh is None:
        return None
    sh = shd.param_shardings(lm, mesh, rules)

    def place(path, x):
        leaf = sh
        for k in path:
            leaf = leaf[k]
        return jax.device_put(x, leaf)

    return place


@functools.partial(jax.jit, static_argnums=0)
def _init_params(lm: TransformerLM, rng):
    # One truncated-normal draw for all parameters, sliced and scaled per leaf by its
    # ``init_std``: XLA:CPU takes ~0.7 s to compile each separate threefry draw, so the
    # per-parameter draws of ``Transformer.__init__`` would cost ~10 s for a tiny model.
    flat = nnx.to_flat_state(lm._abstract_state)
    total = sum(int(np.prod(v.shape)) for _, v in flat)
    z = jax.random.truncated_normal(rng, -2.0, 2.0, (total,), jnp.float32)
    params, offset = {}, 0
    for path, var in flat:
        size = int(np.prod(var.shape))
        noise = z[offset : offset + size].reshape(var.shape)
        node = params
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = scale_noise(noise, var.get_metadata().get('init_std'), var.dtype)
        offset += size
    return params


def _logical_axes_of(v) -> tuple:
    return tuple(v.get_metadata().get('out_sharding') or (None,) * len(v.shape))
