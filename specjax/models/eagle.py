"""A feature drafter (EAGLE, Li et al. 2024): one decoder layer over the verifier's features.

A small drafter with its own embedding has to learn the verifier's language from scratch;
on SmolLM2 a 4-layer distilled drafter reached α ≈ 0.35. EAGLE instead drafts from the
verifier's own last hidden state: at position ``t`` it reads the verifier's embedding of
token ``x_t`` and the verifier's final-normed hidden state ``f_{t-1}`` (what the verifier's
head read to predict ``x_t``), concatenates them, projects ``2D -> D`` and runs ONE decoder
layer at the verifier's width (``n_layers`` of them if asked: `eagle_config`). Its output
``h_t`` stands in for ``f_t`` and the verifier's
own (frozen) head turns it into logits. While drafting, the verifier's feature for the
token just drafted does not exist yet, so step ``j > 1`` reads the drafter's own ``h``
instead: the drafter is autoregressive in feature space.

The head is the verifier's tied embedding restricted to the ``K`` most frequent ids
(FR-Spec, as `SubsetVocabLM`): logits of the other ids are `NEG_LOGIT` (probability 0), so
every rule stays lossless — a rule only uses the ``q`` that was sampled from.

Parameters ``{'net', 'embed', 'head', 'keep'}``: ``net`` the trained projection and layer;
``embed`` f[V, D] the verifier's input table (a half-precision one as its uint16 bits on
the CPU, `cache_lib.table_bits`), ``head`` f[K, D] its rows ``keep`` i32[K] —
both the verifier's, frozen, never saved with the drafter (`specjax.models.real_zoo`
rebuilds them from the verifier at load).

The cache (`FeatureCache`) holds the layers' keys/values, the verifier's features by slot
(``feats``, valid below ``vlen``, written by the engine after each verifier call:
`write_features`) and the drafter's own outputs by slot (``hid``). The input feature of
the token at slot ``p`` is ``feats[p-1]`` where ``p-1 < vlen``, else ``hid[p-1]`` (zero at
``p = 0``); a block is fed only where that slot is already written (the engine feeds a
block of committed tokens whose verifier features are all known, and drafts one token at
a time).

With ``feature_layers`` (EAGLE-3, Li et al. 2025) the drafter reads several of the verifier's
states instead of its final one: the residual stream after some blocks (low, mid, high) and
optionally the final-normed state, concatenated [.., n·D] by the verifier
(`TransformerLM.forward_hidden(layers=...)`); each D-slice is RMS-normalised, ``fuse``
[n·D -> D] mixes them into the layer's input feature, and a trained ``out_norm`` sits before
the head (the output is no longer tied to the verifier's final feature). Step ``j > 1``
reads the drafter's own output as before; ``feats`` then holds the n·D states.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from specjax.errors import ConfigError
from specjax.models import cache as cache_lib
from specjax.models.api import _logical_axes_of, causal_block_mask
from specjax.models.drafter_kind import DrafterKind, Drafting, QSupport, register
from specjax.models.fused import _flip, order_params
from specjax.models.products import project
from specjax.models.subset_vocab import NEG_LOGIT
from specjax.models.transformer import (
    Block,
    RMSNorm,
    TransformerConfig,
    _fan_in_std,
    _param,
    _weight,
)

__all__ = ['EagleLM', 'EAGLE', 'FeatureCache', 'eagle_config', 'order_eagle']


@struct.dataclass
class FeatureCache:
    """k, v: the layers' keys/values (`specjax.models.cache.Cache` layout, one per layer);
    length: i32[B]; feats: [B, S, D] the verifier's features by slot, valid below
    ``vlen`` i32[B]; hid: [B, S, D] the drafter's own outputs by slot."""

    k: cache_lib.PerLayer
    v: cache_lib.PerLayer
    length: jax.Array
    feats: jax.Array
    hid: jax.Array
    vlen: jax.Array

    @property
    def max_len(self) -> int:
        return self.feats.shape[1]

    capacity = max_len

    @property
    def batch(self) -> int:
        return self.feats.shape[0]

    def kv(self) -> cache_lib.Cache:
        return cache_lib.Cache(k=self.k, v=self.v, length=self.length)

    def with_kv(self, c: cache_lib.Cache) -> 'FeatureCache':
        return self.replace(k=c.k, v=c.v, length=c.length)

    @staticmethod
    def logical_axes() -> 'FeatureCache':
        kv = cache_lib.Cache.logical_axes()
        return FeatureCache(
            k=kv.k,
            v=kv.v,
            length=('batch',),
            feats=('batch', 'cache_length', 'embed'),
            hid=('batch', 'cache_length', 'embed'),
            vlen=('batch',),
        )


def eagle_config(verifier_config: TransformerConfig, kept: int, **overrides) -> TransformerConfig:
    """The drafter layers' config: the verifier's width, heads, MLP and RoPE, one layer
    (``n_layers=`` for more), ``vocab_size = kept`` (the head's rows). Its layers attend to
    every earlier position (a verifier's sliding-window layers, Gemma 3's, name indices of
    its own stack: none of the drafter's is local)."""
    fields = dict(
        vocab_size=int(kept),
        n_layers=1,
        tie_embeddings=True,
        embed_input_scale=False,
        fused_projections=False,
        local_layers=(),
    )
    fields.update(overrides)
    return dataclasses.replace(verifier_config, **fields)


class _Net(nnx.Module):
    """concat(embedding, feature) -> fc [2D -> D] + bias -> ``cfg.n_layers`` decoder layers
    (``layer_0`` … , one in EAGLE); with ``n`` verifier states per position (``n > 0``) also
    ``fuse`` [n·D -> D] for them and an ``out_norm`` before the head."""

    def __init__(self, cfg: TransformerConfig, n: int = 0, *, rngs: nnx.Rngs):
        d = cfg.d_model
        self.cfg = cfg
        self.n = n
        self.fc = _weight(
            rngs, cfg, ((2 * d, 'mlp'),), ((d, 'embed'),), _fan_in_std(2 * d), cfg.param_dtype
        )
        self.fc_bias = _param(rngs, (d,), ('embed',), 1e-6, cfg.param_dtype)
        for i in range(cfg.n_layers):
            setattr(self, f'layer_{i}', Block(cfg, rngs=rngs))
        if n:
            self.fuse = _weight(
                rngs, cfg, ((n * d, 'mlp'),), ((d, 'embed'),), _fan_in_std(n * d), cfg.param_dtype
            )
            self.out_norm = RMSNorm(d, cfg, rngs=rngs)

    def fused(self, feats):
        """The verifier's n states [.., n·D] -> the layer's input feature [.., D]: each
        state RMS-normalised (a mid-layer residual stream is not at the final one's scale),
        then ``fuse``."""
        dt = jnp.dtype(self.cfg.dtype)
        d = self.cfg.d_model
        x = feats.astype(jnp.float32).reshape(feats.shape[:-1] + (self.n, d))
        x = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + self.cfg.norm_eps)
        x = x.reshape(feats.shape).astype(dt)
        return project(x, self.fuse[...], dt, out_first=self.cfg.out_first)

    def __call__(self, emb, feat, positions, block_mask, caches=None):
        """h [B, T, D] and each layer's (keys, values); ``caches``: None or one (k, v,
        length) per layer."""
        dt = jnp.dtype(self.cfg.dtype)
        x = jnp.concatenate([emb.astype(dt), feat.astype(dt)], axis=-1)
        x = project(x, self.fc[...], dt, out_first=self.cfg.out_first)
        x = x + self.fc_bias[...].astype(dt)
        kvs = []
        for i in range(self.cfg.n_layers):
            x, kv = getattr(self, f'layer_{i}')(
                x, positions, block_mask, None if caches is None else caches[i]
            )
            kvs.append(kv)
        return x, kvs


def _take_slots(arr: jax.Array, slots: jax.Array) -> jax.Array:
    """arr [B, S, D] at slots i32[B, T] (clipped) -> [B, T, D] (through 16-bit words for a
    half-precision ``arr``: `cache_lib.half_get`)."""
    b = jnp.arange(arr.shape[0])[:, None]
    return cache_lib.half_get(arr, (b, jnp.clip(slots, 0, arr.shape[1] - 1)))


def _put_slots(arr: jax.Array, slots: jax.Array, values: jax.Array, ok: jax.Array) -> jax.Array:
    """arr [B, S, D] with values [B, T, D] written at slots i32[B, T] where ``ok``
    (elsewhere, and past capacity, nothing is written)."""
    b = jnp.arange(arr.shape[0])[:, None]
    slots = jnp.where(ok, slots, arr.shape[1])  # out of range: dropped
    return cache_lib.half_set(arr, (b, slots), values, mode='drop')


@dataclasses.dataclass(frozen=True)
class EagleLM:
    """The feature drafter of a verifier of ``verifier_vocab`` ids (the LM API, plus
    `write_features`); ``config`` is its layers' (`eagle_config`; one in EAGLE)."""

    config: TransformerConfig
    verifier_vocab: int
    #: The verifier states it reads (`TransformerLM.forward_hidden`'s ``layers``); () for
    #: the final-normed state alone (EAGLE-1/2, no ``fuse``).
    feature_layers: tuple = ()
    graphdef: Any = dataclasses.field(init=False, compare=False, hash=False, repr=False)
    _abstract: Any = dataclasses.field(init=False, compare=False, hash=False, repr=False)

    def __post_init__(self):
        if self.config.n_layers < 1:
            raise ValueError(f'EagleLM.config.n_layers={self.config.n_layers} (allowed: ≥ 1)')
        if not 1 <= self.config.vocab_size <= self.verifier_vocab:
            raise ValueError(
                f'EagleLM.config.vocab_size={self.config.vocab_size}: the head rows K '
                f'(allowed: 1 <= K <= verifier_vocab={self.verifier_vocab})'
            )
        layers = tuple(int(i) for i in self.feature_layers)
        if len(set(layers)) != len(layers):
            raise ValueError(f'EagleLM.feature_layers={layers} (allowed: distinct layer indices)')
        object.__setattr__(self, 'feature_layers', layers)
        abstract = nnx.eval_shape(lambda: _Net(self.config, len(layers), rngs=nnx.Rngs(0)))
        graphdef, state = nnx.split(abstract)
        object.__setattr__(self, 'graphdef', graphdef)
        object.__setattr__(self, '_abstract', state)

    @property
    def vocab_size(self) -> int:
        return self.verifier_vocab

    @property
    def max_len(self) -> int:
        return self.config.max_len

    @property
    def n_kept(self) -> int:
        return self.config.vocab_size

    @property
    def verifier_layers(self):
        """The ``layers`` to ask the verifier's `forward_hidden` for (None: its final-normed
        state, the default)."""
        return self.feature_layers or None

    @property
    def feature_width(self) -> int:
        """The width of the verifier features it reads (D, or n·D with ``feature_layers``)."""
        return self.config.d_model * max(1, len(self.feature_layers))

    # -- parameters -----------------------------------------------------------------------
    def init_net(self, rng) -> dict:
        """Fresh ``net`` parameters (the trained part)."""
        rng = jax.random.key(int(rng)) if isinstance(rng, (int, np.integer)) else rng
        net = _Net(self.config, len(self.feature_layers), rngs=nnx.Rngs(rng))
        return nnx.to_pure_dict(nnx.state(net))

    def attach(self, net: dict, verifier_embed, keep) -> dict:
        """The full parameters: ``net`` with the verifier's frozen table and head rows."""
        keep = np.asarray(keep, np.int64)
        if keep.shape != (self.n_kept,) or len(np.unique(keep)) != self.n_kept:
            raise ValueError(f'EagleLM.attach: keep must hold {self.n_kept} distinct ids')
        if keep.min() < 0 or keep.max() >= self.verifier_vocab:
            raise ValueError(f'EagleLM.attach: keep ids must lie in [0, {self.verifier_vocab})')
        embed = jnp.asarray(verifier_embed)
        if embed.shape != (self.verifier_vocab, self.config.d_model):
            raise ValueError(
                f'EagleLM.attach: verifier_embed shape {embed.shape} (allowed: '
                f'({self.verifier_vocab}, {self.config.d_model}))'
            )
        keep = jnp.asarray(keep, jnp.int32)
        # Only read by row: stored as bits where that is how rows are fastest read.
        return {'net': net, 'embed': cache_lib.table_bits(embed), 'head': embed[keep], 'keep': keep}

    def abstract_params(self) -> dict:
        d, dt = self.config.d_model, jnp.dtype(self.config.param_dtype)
        return {
            'net': nnx.to_pure_dict(self._abstract),
            'embed': jax.ShapeDtypeStruct((self.verifier_vocab, d), dt),
            'head': jax.ShapeDtypeStruct((self.n_kept, d), dt),
            'keep': jax.ShapeDtypeStruct((self.n_kept,), jnp.int32),
        }

    def param_logical_axes(self) -> dict:
        return {
            'net': nnx.to_pure_dict(self._abstract, extract_fn=_logical_axes_of),
            'embed': ('vocab', 'embed'),
            'head': ('vocab', 'embed'),
            'keep': (None,),
        }

    # -- cache ----------------------------------------------------------------------------
    def init_cache(self, batch: int, capacity: int | None = None) -> FeatureCache:
        c = self.config
        capacity = c.max_len if capacity is None else int(capacity)
        if not 1 <= capacity <= c.max_len:
            raise ValueError(
                f'EagleLM.init_cache: capacity={capacity} (allowed: 1 <= capacity <= '
                f'max_len={c.max_len})'
            )
        dt = jnp.dtype(c.dtype)
        kv = cache_lib.init_cache(c.n_layers, batch, capacity, c.n_kv_heads, c.head_dim, dt)
        z = jnp.zeros((batch, capacity, c.d_model), dt)
        f = jnp.zeros((batch, capacity, self.feature_width), dt) if self.feature_layers else z
        return FeatureCache(
            k=kv.k, v=kv.v, length=kv.length, feats=f, hid=z, vlen=jnp.zeros((batch,), jnp.int32)
        )

    def advance(self, cache: FeatureCache, n) -> FeatureCache:
        return cache.with_kv(cache_lib.advance(cache.kv(), n))

    def rollback(self, cache: FeatureCache, new_length) -> FeatureCache:
        c = cache.with_kv(cache_lib.rollback(cache.kv(), new_length))
        return c.replace(vlen=jnp.minimum(c.vlen, c.length))

    def compact(self, cache: FeatureCache, src, n) -> FeatureCache:
        """`specjax.models.cache.compact` for the keys/values and the own outputs."""
        src = jnp.asarray(src, jnp.int32)
        base = cache.length[:, None]
        moved = _take_slots(cache.hid, base + src)
        dst = base + jnp.arange(src.shape[1])[None, :]
        hid = _put_slots(cache.hid, dst, moved, jnp.ones(dst.shape, bool))
        out = cache.with_kv(cache_lib.compact(cache.kv(), src, n)).replace(hid=hid)
        return out.replace(vlen=jnp.minimum(out.vlen, cache.length))

    def write_features(self, cache: FeatureCache, feats, start, n) -> FeatureCache:
        """The verifier's features ``feats`` [B, W, D] written at slots ``start + j``
        (j < n, i32[B] each); ``vlen = start + n`` where ``n > 0``."""
        start = jnp.asarray(start, jnp.int32)
        n = jnp.asarray(n, jnp.int32)
        j = jnp.arange(feats.shape[1])[None, :]
        out = _put_slots(cache.feats, start[:, None] + j, feats, j < n[:, None])
        vlen = jnp.where(n > 0, jnp.minimum(start + n, cache.max_len), cache.vlen)
        return cache.replace(feats=out, vlen=vlen)

    # -- compute --------------------------------------------------------------------------
    def _net(self, net) -> _Net:
        return nnx.merge(self.graphdef, nnx.State(net))

    def scatter(self, params, kept_logits) -> jax.Array:
        """Head logits f32[..., K] -> verifier-space logits f32[..., V]."""
        lead = kept_logits.shape[:-1]
        out = jnp.full(lead + (self.verifier_vocab,), NEG_LOGIT, jnp.float32)
        return out.at[..., params['keep']].set(kept_logits.astype(jnp.float32))

    def head_logits(self, params, h) -> jax.Array:
        """f32[B, T, K]: the frozen head over the kept ids, on a final-normed-like state
        (the verifier's own feature, or `head_input` of the drafter's output)."""
        dt = jnp.dtype(self.config.dtype)
        return project(h, params['head'].astype(dt), dt, out_dtype=jnp.float32, out_first=True)

    def head_input(self, params, h) -> jax.Array:
        """The drafter's output ``h`` as its head reads it (``out_norm`` with
        ``feature_layers``, else ``h`` itself: trained to be the verifier's feature)."""
        if not self.feature_layers:
            return h
        return self._net(params['net']).out_norm(h)

    def draft_logits(self, params, h) -> jax.Array:
        """f32[B, T, K]: the head over the kept ids on the drafter's outputs ``h``."""
        return self.head_logits(params, self.head_input(params, h))

    def input_features(self, params, feats) -> jax.Array:
        """The verifier's features [.., W] (W = `feature_width`) as the layer's input
        features [.., D] (``fuse`` with ``feature_layers``; else the identity)."""
        if not self.feature_layers:
            return feats
        return self._net(params['net']).fused(feats)

    def table(self, params) -> jax.Array:
        """The verifier's input table [V, D] (its values, however ``embed`` is stored)."""
        return cache_lib.table_values(params['embed'], params['head'].dtype)

    def embed(self, params, tokens) -> jax.Array:
        """The verifier's rows of ``tokens`` (`cache_lib.half_take`: a plain take of the
        bf16 table let XLA:CPU convert all of it to f32 once per call, 40 ms, ~2.5 draft
        steps' worth)."""
        return cache_lib.half_take(params['embed'], tokens, dtype=params['head'].dtype)

    def forward(self, params, cache: FeatureCache, tokens, positions, block_mask, logits_at=None):
        """Scores a block (the LM API): logits f32[B, T, V] (f32[B, R, V] at the block
        positions ``logits_at`` i32[B, R]) and the cache with the block's keys/values and
        own outputs written at slots [length, length + T)."""
        B, T = tokens.shape
        slots = cache.length[:, None] + jnp.arange(T)[None, :]
        prev = slots - 1
        true = self.input_features(params, _take_slots(cache.feats, prev))
        own = _take_slots(cache.hid, prev)
        feat = jnp.where((prev < cache.vlen[:, None])[:, :, None], true, own)
        feat = jnp.where((prev >= 0)[:, :, None], feat, 0)
        n = self.config.n_layers
        h, kvs = self._net(params['net'])(
            self.embed(params, tokens),
            feat,
            positions,
            block_mask,
            [(cache.k[i], cache.v[i], cache.length) for i in range(n)],
        )
        hid = _put_slots(cache.hid, slots, h, jnp.ones(slots.shape, bool))
        cache = cache.replace(
            k=cache_lib.PerLayer([k for k, _ in kvs]),
            v=cache_lib.PerLayer([v for _, v in kvs]),
            hid=hid,
        )
        hh = h if logits_at is None else cache_lib.block_rows(h, logits_at)
        return self.scatter(params, self.draft_logits(params, hh)), cache

    def hidden_full(self, params, tokens, feats) -> jax.Array:
        """Teacher-forced outputs h [B, T, D] over whole sequences: position t reads token
        t and the input feature ``feats`` [B, T, D] at t - 1 (training and offline
        evaluation): `input_features` of the verifier's, or the drafter's own outputs."""
        B, T = tokens.shape
        prev = jnp.concatenate([jnp.zeros_like(feats[:, :1]), feats[:, :-1]], axis=1)
        positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
        h, _ = self._net(params['net'])(
            self.embed(params, tokens), prev, positions, causal_block_mask(B, T)
        )
        return h


def order_eagle(lm: EagleLM, params: dict, out_first: bool = True) -> tuple[EagleLM, dict]:
    """``(lm', params')``: the same drafter with its trained projections (``fc`` and the
    layer's q/k/v/o, gate/up/down) stored output dims first (``out_first``,
    `TransformerConfig.out_first`) or back; the same outputs up to the products' rounding.

    Drafters are trained in the default ``[in, out]`` order; a verifier loaded
    ``out_first`` (the faster bf16 one-row products on XLA:CPU, docs/performance.md)
    wants its drafter in the same order: a bf16 ``[in, out]`` layer cost twice a verifier
    layer's time per token (run real_speed_eagle's c, docs/performance.md).
    """
    if bool(lm.config.out_first) == bool(out_first):
        return lm, params
    net = order_params(lm.config, params['net'], out_first)
    net = dict(net, fc=_flip(net['fc'], 1, out_first))
    if 'fuse' in net:
        net = dict(net, fuse=_flip(net['fuse'], 1, out_first))
    new = EagleLM(
        dataclasses.replace(lm.config, out_first=bool(out_first)),
        lm.verifier_vocab,
        lm.feature_layers,
    )
    return new, dict(params, net=net)


def _eagle_drafting(lm: EagleLM, params) -> Drafting:
    """Its logits are over the verifier's ids (``NEG_LOGIT``, probability 0, off the head),
    so it drafts in the verifier's ids, drawn over its head's ids ``params['keep']`` where
    the params hold them: identity maps alone are exact too, but then every draft step
    normalises, sums and searches 49,152 probabilities for SmolLM2 (0.32 ms on the 2-core
    Xeon, half the drafter's forward) where 4,096 carry all the mass (0.04 ms)."""
    return Drafting(lm, params, support=params['keep'] if 'keep' in params else None)


def _eagle_check_verifier(lm: EagleLM, verifier, name: str) -> None:
    """The verifier gives its hidden states (`forward_hidden`), the states ``lm`` reads
    among them, at its width."""
    if not hasattr(verifier, 'forward_hidden'):
        raise ConfigError(
            f"drafter {name!r} reads the verifier's features; allowed: a verifier with "
            f'forward_hidden (a TransformerLM), not {type(verifier).__name__}'
        )
    layers = lm.verifier_layers
    n_layers = getattr(getattr(verifier, 'config', None), 'n_layers', None)
    if layers is not None and (n_layers is None or any(not 0 <= i <= n_layers for i in layers)):
        raise ConfigError(
            f'drafter {name!r} feature_layers: got {tuple(layers)}; allowed: layer '
            f'indices in [0, {n_layers}] of a TransformerLM verifier ({n_layers} its '
            'final-normed state)'
        )
    want = getattr(getattr(verifier, 'config', None), 'd_model', None)
    if want is not None and lm.config.d_model != want:
        raise ConfigError(
            f'drafter {name!r} d_model: got {lm.config.d_model}; allowed: the '
            f"verifier's width {want}"
        )


def _eagle_example(verifier, lm, kept: int):
    """One layer at the verifier's width over its final-normed state, a head of ``kept``
    ids (the verifier's first)."""
    del lm
    eagle = EagleLM(eagle_config(verifier.config, kept), verifier.vocab_size, ())
    return eagle, dict(eagle.abstract_params(), keep=np.arange(kept, dtype=np.int32))


#: The feature drafter: it reads the verifier's hidden states, its law on its head's ids.
EAGLE = register(
    DrafterKind(
        name='eagle',
        lm_type=EagleLM,
        q_support=QSupport.HEAD,
        reads_features=True,
        verifier_layers=lambda lm: lm.verifier_layers,
        drafting=_eagle_drafting,
        check_verifier=_eagle_check_verifier,
        example=_eagle_example,
        summary="EAGLE: one layer over the verifier's hidden states, a head of K ids",
    )
)
