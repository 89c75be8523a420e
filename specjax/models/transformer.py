"""A decoder-only Llama-style transformer in flax.nnx.

RMSNorm (pre-norm), rotary positions with explicit position ids, SwiGLU MLP,
grouped-query attention, untied or tied embeddings; and the switches other families need
(Gemma 3: q/k norms, post-norms with ``(1 + w)`` scales, GeGLU, a query scale, local
layers with a sliding window and their own rotary base), off by default. Every parameter carries logical axis
names in its ``out_sharding`` metadata (``nnx.with_partitioning``'s key; the older
``sharding_names`` is deprecated in flax 0.12) with eager sharding off, so building the
model never needs a mesh: placement is ``specjax.runtime.sharding``'s job.

The module is driven through the functional API in ``specjax.models.api``; it never owns
a cache. ``Transformer.__call__`` takes the cache arrays, writes the block's keys/values
at slots ``[length, length + T)`` and returns the updated arrays (``length`` is the
caller's to move).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax.models.cache import (
    PerLayer,
    block_rows,
    half_take,
    keys_slots_major,
    table_values,
    write_block,
    write_keys,
)
from specjax.models.products import project
from specjax.models.rope import parse_rope_scaling, rotary
from specjax.runtime.sharding import with_logical_constraint

_DTYPES = ('float32', 'bfloat16', 'float16', 'float64')
_NEG = float(np.finfo(np.float32).min)  # finite, so a fully masked row gives no NaN


def gelu_tanh(x: jax.Array) -> jax.Array:
    """The tanh-approximated GELU in the order PyTorch evaluates it (``0.5·x·(1 + tanh(β·(x
    + κ·x·x·x)))``, constants in ``x``'s dtype). The same function as ``jax.nn.gelu(x,
    approximate=True)`` up to rounding, but more accurate where it was measured: on
    Gemma-3-270M in f32 (held-out text, 700 tokens) max |Δ logit| from transformers' f64
    forward 2.1e-4 (whole sequence) and 1.9e-4 (a 500-token cached prefill) against 3.1e-4
    and 2.2e-4 in jax's order; transformers' own f32 forward is 2.5e-4 from its f64."""
    dt = x.dtype
    beta = jnp.asarray(np.sqrt(2.0) * (2.0 / np.sqrt(np.pi)) * 0.5, dt)
    inner = beta * (x + jnp.asarray(0.044715, dt) * x * x * x)
    return jnp.asarray(0.5, dt) * x * (jnp.asarray(1.0, dt) + jnp.tanh(inner))


#: MLP gate activations (`TransformerConfig.mlp_act`): SwiGLU's and GeGLU's (tanh GELU).
_ACTS = {'silu': jax.nn.silu, 'gelu_tanh': gelu_tanh}


def _dtype_name(value, field: str) -> str:
    try:
        name = jnp.dtype(value).name
    except TypeError:
        name = None
    if name not in _DTYPES:
        raise ValueError(f'TransformerConfig.{field}={value!r}: must be one of {_DTYPES}')
    if name == 'float64' and not jax.config.jax_enable_x64:
        raise ValueError(
            f'TransformerConfig.{field}={value!r}: float64 needs jax_enable_x64 (an exactness '
            "check's dtype: jax.config.update('jax_enable_x64', True) first)"
        )
    return name


def accumulation(dtype) -> jnp.dtype:
    """The dtype products and reductions accumulate in: f32 for f32 and half-precision
    compute, f64 for f64 (an exactness check against a float64 reference)."""
    return jnp.promote_types(jnp.dtype(dtype), jnp.float32)


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Static hyperparameters of the transformer (hashable, JSON-friendly)."""

    vocab_size: int = 256  # number of token ids
    d_model: int = 128  # residual stream width
    n_layers: int = 2  # transformer blocks
    n_heads: int = 4  # query heads; head_dim = d_model // n_heads (even)
    n_kv_heads: int = 4  # key/value heads (GQA); divides n_heads
    d_ff: int = 512  # SwiGLU hidden width
    max_len: int = 512  # context length (positions; the largest KV-cache capacity)
    rope_theta: float = 10_000.0  # rotary base
    tie_embeddings: bool = False  # output projection = embedding matrix transposed
    dtype: str = 'float32'  # compute dtype (logits f32; f64 only under jax_enable_x64)
    param_dtype: str = 'float32'  # storage dtype of parameters
    # Fields for imported Hugging Face families (specjax.models.hf). `to_dict` omits them
    # at their defaults, so zoo manifests and recipe hashes written before them are unchanged.
    norm_eps: float = 1e-6  # RMSNorm epsilon
    rope_scaling: tuple = ()  # () or sorted (key, value) pairs, e.g. (('factor', 8.0),
    #                               ('rope_type', 'linear')); types: 'linear', 'llama3'
    qkv_bias: bool = False  # biases on the q/k/v projections (Qwen2)
    embed_input_scale: bool = True  # tied only: inputs times sqrt(d_model) (Gemma-style);
    #                                 HF Llama / Qwen2 / Mistral do not scale
    fused_projections: bool = False  # q/k/v in one product (wqkv [D, KV, G+2, hd]) and
    #                                  gate/up in one (w_gate_up [D, 2, F]); same function
    out_first: bool = False  # projection weights stored output dims first ([out, in], as
    #                          HF and GGUF keep them: wq [H, hd, D], lm_head [V, D]); the
    #                          products contract their last dims; same function
    # Architecture switches of other families (Gemma 3: `specjax.models.families.gemma3`);
    # at their defaults a model is the Llama-style one above, program for program.
    head_size: int = 0  # query/key/value head size; 0: d_model // n_heads
    qk_norm: bool = False  # RMSNorm over each query and key head (before rotary)
    post_norms: bool = False  # RMSNorm on the attention's and the MLP's outputs too
    #                           (Gemma's four norms per block)
    norm_plus_one: bool = False  # every RMSNorm scales by (1 + w) (Gemma), not w
    mlp_act: str = 'silu'  # gate activation: 'silu' (SwiGLU) or 'gelu_tanh' (GeGLU)
    query_pre_attn_scalar: float = 0.0  # queries times this ** -1/2; 0: head_size
    sliding_window: int = 0  # local layers attend to keys at positions (p - window, p]
    local_layers: tuple = ()  # indices of the local (sliding-window) layers
    rope_local_theta: float = 0.0  # rotary base of the local layers (unscaled); 0: as
    #                                 the global layers (rope_theta, rope_scaling)

    def __post_init__(self):
        def check_int(field, lo, hi=None, extra=''):
            v = getattr(self, field)
            ok = isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= lo
            ok = ok and (hi is None or v <= hi)
            if not ok:
                rng = f'[{lo}, {hi}]' if hi is not None else f'>= {lo}'
                raise ValueError(
                    f'TransformerConfig.{field}={v!r}: must be an integer {rng}{extra}'
                )

        for f in ('vocab_size', 'd_model', 'n_layers', 'n_heads', 'd_ff', 'max_len'):
            check_int(f, 1)
        check_int('n_kv_heads', 1, self.n_heads, f' dividing n_heads={self.n_heads}')
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f'TransformerConfig.n_kv_heads={self.n_kv_heads}: must divide '
                f'n_heads={self.n_heads} (allowed: a divisor of {self.n_heads})'
            )
        check_int('head_size', 0)
        if self.head_size % 2:
            raise ValueError(
                f'TransformerConfig.head_size={self.head_size}: must be even (rotary pairs)'
            )
        if not self.head_size and (
            self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2
        ):
            raise ValueError(
                f'TransformerConfig.n_heads={self.n_heads}: d_model={self.d_model} '
                f'must split into n_heads heads of even size (rotary pairs)'
            )
        if not (isinstance(self.rope_theta, (int, float)) and self.rope_theta > 0):
            raise ValueError(f'TransformerConfig.rope_theta={self.rope_theta!r}: must be > 0')
        if not isinstance(self.tie_embeddings, bool):
            raise ValueError(
                f'TransformerConfig.tie_embeddings={self.tie_embeddings!r}: must be True or False'
            )
        object.__setattr__(self, 'dtype', _dtype_name(self.dtype, 'dtype'))
        object.__setattr__(self, 'param_dtype', _dtype_name(self.param_dtype, 'param_dtype'))
        object.__setattr__(self, 'rope_theta', float(self.rope_theta))
        if not (isinstance(self.norm_eps, (int, float)) and 0 < self.norm_eps < 1):
            raise ValueError(f'TransformerConfig.norm_eps={self.norm_eps!r}: must be in (0, 1)')
        object.__setattr__(self, 'norm_eps', float(self.norm_eps))
        object.__setattr__(self, 'rope_scaling', parse_rope_scaling(self.rope_scaling))
        for f in (
            'qkv_bias',
            'embed_input_scale',
            'fused_projections',
            'out_first',
            'qk_norm',
            'post_norms',
            'norm_plus_one',
        ):
            if not isinstance(getattr(self, f), bool):
                raise ValueError(
                    f'TransformerConfig.{f}={getattr(self, f)!r}: must be True or False'
                )
        if self.mlp_act not in _ACTS:
            raise ValueError(
                f'TransformerConfig.mlp_act={self.mlp_act!r}: must be one of {tuple(_ACTS)}'
            )
        for f in ('query_pre_attn_scalar', 'rope_local_theta'):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise ValueError(f'TransformerConfig.{f}={v!r}: must be a number >= 0')
            object.__setattr__(self, f, float(v))
        check_int('sliding_window', 0)
        try:
            local = tuple(sorted({int(i) for i in self.local_layers}))
        except (TypeError, ValueError):
            local = None
        if local is None or any(not 0 <= i < self.n_layers for i in local):
            raise ValueError(
                f'TransformerConfig.local_layers={self.local_layers!r}: must be layer '
                f'indices in [0, {self.n_layers})'
            )
        if local and not self.sliding_window:
            raise ValueError(f'TransformerConfig.local_layers={local}: needs sliding_window >= 1')
        object.__setattr__(self, 'local_layers', local)

    @property
    def head_dim(self) -> int:
        return self.head_size or self.d_model // self.n_heads

    def layer_window(self, i: int) -> int:
        """Layer ``i``'s sliding window (0: it attends to every earlier position)."""
        return self.sliding_window if i in self.local_layers else 0

    def layer_rope(self, i: int) -> tuple[float, tuple]:
        """Layer ``i``'s rotary base and scaling: a local layer's own base, unscaled,
        where the config has one (Gemma 3's), else the model's."""
        if i in self.local_layers and self.rope_local_theta:
            return self.rope_local_theta, ()
        return self.rope_theta, self.rope_scaling

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for f in _LATER_FIELDS:  # omitted at their defaults: older dicts stay byte-identical
            if d[f] == _DEFAULTS[f]:
                del d[f]
        if 'rope_scaling' in d:
            d['rope_scaling'] = [list(kv) for kv in d['rope_scaling']]
        if 'local_layers' in d:
            d['local_layers'] = list(d['local_layers'])
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> 'TransformerConfig':
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(
                f'TransformerConfig: unknown fields {unknown} (allowed: {sorted(known)})'
            )
        return cls(**d)


_LATER_FIELDS = (
    'norm_eps',
    'rope_scaling',
    'qkv_bias',
    'embed_input_scale',
    'fused_projections',
    'out_first',
    'head_size',
    'qk_norm',
    'post_norms',
    'norm_plus_one',
    'mlp_act',
    'query_pre_attn_scalar',
    'sliding_window',
    'local_layers',
    'rope_local_theta',
)
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TransformerConfig)}
_TRUNC_STD = 0.87962566103423978  # std of a standard normal truncated to [-2, 2]


def init_value(key, shape, init_std: float | None, dtype) -> jax.Array:
    """The one initialisation rule: ones (``init_std=None``) or a normal truncated at two
    standard deviations with standard deviation ``init_std``. ``key=None`` with a
    standard truncated-normal ``noise`` array is the batched path of ``init_params``."""
    if init_std is None:
        return jnp.ones(shape, dtype)
    z = jax.random.truncated_normal(key, -2.0, 2.0, shape, jnp.float32)
    return scale_noise(z, init_std, dtype)


def scale_noise(z: jax.Array, init_std: float | None, dtype) -> jax.Array:
    if init_std is None:
        return jnp.ones(z.shape, dtype)
    return (z * (init_std / _TRUNC_STD)).astype(dtype)


def _param(rngs: nnx.Rngs, shape, axes, init_std: float | None, dtype) -> nnx.Param:
    """A parameter with logical axes (``out_sharding``) and its init rule (``init_std``).

    Eager sharding is off: logical names mean nothing without rules, and placement is
    ``specjax.runtime.sharding``'s job.
    """
    value = init_value(rngs.params(), shape, init_std, jnp.dtype(dtype))
    return nnx.Param(value, out_sharding=axes, eager_sharding=False, init_std=init_std)


def _weight(
    rngs: nnx.Rngs, cfg: 'TransformerConfig', ins: tuple, outs: tuple, init_std, dtype
) -> nnx.Param:
    """A projection weight from its input dims ``ins`` and output dims ``outs``, each a
    tuple of (size, logical axis): stored ``[*in, *out]``, or ``[*out, *in]`` where
    ``cfg.out_first``."""
    dims = outs + ins if cfg.out_first else ins + outs
    return _param(rngs, tuple(n for n, _ in dims), tuple(a for _, a in dims), init_std, dtype)


def _fan_in_std(fan_in: int, scale: float = 1.0) -> float:
    return float(np.sqrt(scale / fan_in))


class RMSNorm(nnx.Module):
    """RMSNorm over the last axis, scaled by ``w`` (by ``1 + w``, ``w`` starting at 0,
    where `TransformerConfig.norm_plus_one`: Gemma's)."""

    def __init__(
        self,
        dim: int,
        cfg: TransformerConfig,
        *,
        rngs: nnx.Rngs,
        eps: float | None = None,
        axis: str = 'embed',
    ):
        self.eps = cfg.norm_eps if eps is None else eps
        self.plus_one = cfg.norm_plus_one
        init = 0.0 if self.plus_one else None
        self.scale = _param(rngs, (dim,), (axis,), init, cfg.param_dtype)

    def __call__(self, x):
        acc = accumulation(x.dtype)
        x32 = x.astype(acc)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        scale = self.scale[...].astype(acc)
        if self.plus_one:
            scale = 1.0 + scale
        return (normed * scale).astype(x.dtype)


CACHE_CHUNK = 128  # slots per block of the blocked cache read (`cache_attention`)
CACHE_MIN_BLOCKS = 4  # caches of fewer blocks are read whole


def cache_attention(
    q,
    cache_k,
    cache_v,
    length,
    dt,
    chunk: int | None = None,
    min_blocks: int | None = None,
    q_pos=None,
    window: int = 0,
):
    """Attention of ``q: [B, KV, Q, hd]`` over the committed slots of one layer's cache
    (keys ``cache_k: [B, KV, hd, S]``, or ``[B, KV, S, hd]`` where `cache.keys_slots_major`;
    values ``cache_v: [B, KV, S, hd]``). With a ``window`` (and ``q_pos: i32[B, Q]``, each
    query row's position) a row sees only slots ``j > q_pos - window``: a committed slot's
    position is its index (the API's convention: the caller commits tokens in order), and
    a blocked read starts at the first block inside some row's window.

    Returns ``(m, z, o)``: per query row the max score ``m`` (``_NEG`` where nothing is
    committed), ``z = Σ exp(s − m)`` and the unnormalised ``o = Σ exp(s − m) v``, f32,
    for the caller to merge with the block's own keys.

    A long cache is read in blocks of ``chunk`` slots (default `CACHE_CHUNK`) with a
    running (online) softmax, and only the ``ceil(max(length) / chunk)`` blocks that hold
    a committed slot of some row are read (a ``while_loop`` with that trip count; a
    prefill on an empty cache reads none), so the cost follows the filled length, not the
    capacity. A cache of fewer than ``min_blocks`` blocks (default `CACHE_MIN_BLOCKS`) is
    read whole in one dot. Both defaults are read at trace time.

    Measured on XLA:CPU (issue 10, zoo verifier, paired runs): a decode step at batch 32
    costs ~1 ms more per 64 slots read (the keys and values stream from memory: 8 MB per
    64 slots over the 4 layers), so at capacity 256 with ≤ 96 slots filled the blocked
    read cut a step from 7.7 to 5.1 ms. But on CPU a block taken with ``dynamic_slice`` is
    copied before its dot, so a cache that is mostly filled costs more read in blocks (a
    speculative round at batch 8, capacity ~130, 64-slot blocks: +6–10 %); hence whole
    reads below `CACHE_MIN_BLOCKS`. (On TPU the slice fuses into the dot's operand.)
    """
    B, KV, S, hd = cache_v.shape
    Q = q.shape[2]
    rows = keys_slots_major(hd)  # keys [B, KV, S, hd] (TPU) or [B, KV, hd, S]
    c = min(chunk or CACHE_CHUNK, S)
    n_blocks = -(-S // c)
    whole = n_blocks < max(CACHE_MIN_BLOCKS if min_blocks is None else min_blocks, 2)
    if whole:
        c = S

    def block(start, lo, m, z, o):
        """Merges slots [lo, start + c) ∩ [0, length) of the block read at ``start``."""
        k_blk = jax.lax.dynamic_slice_in_dim(cache_k, start, c, axis=2 if rows else 3).astype(dt)
        v_blk = jax.lax.dynamic_slice_in_dim(cache_v, start, c, axis=2).astype(dt)
        s = jnp.einsum(
            'bkqh,bksh->bkqs' if rows else 'bkqh,bkhs->bkqs',
            q,
            k_blk,
            preferred_element_type=accumulation(dt),
        )
        slot = start + jnp.arange(c)
        valid = ((slot[None, :] >= lo) & (slot[None, :] < length[:, None]))[:, None, None, :]
        if window:  # [B, 1, Q, c]: the slots inside each query row's window
            valid = valid & (slot[None, None, :] > q_pos[:, :, None] - window)[:, None]
        s = jnp.where(valid, s, _NEG)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        e = jnp.where(valid, jnp.exp(s - m_new[..., None]), 0.0)
        r = jnp.exp(m - m_new)
        z = z * r + jnp.sum(e, axis=-1)
        o = o * r[..., None] + jnp.einsum(
            'bkqs,bksh->bkqh', e.astype(dt), v_blk, preferred_element_type=accumulation(dt)
        )
        return m_new, z, o

    init = (
        jnp.full((B, KV, Q), _NEG, accumulation(dt)),
        jnp.zeros((B, KV, Q), accumulation(dt)),
        jnp.zeros((B, KV, Q, hd), accumulation(dt)),
    )
    if whole:
        return block(0, 0, *init)
    # Blocks that hold a committed slot of some row; the last block's start is clamped
    # (S need not be a multiple of c) and its slots before i·c are masked (read once).
    n = jnp.minimum((jnp.max(length) + c - 1) // c, n_blocks)

    def body(i, mzo):
        return block(jnp.minimum(i * c, S - c), i * c, *mzo)

    first = 0
    if window:  # blocks wholly before every query row's window are not read
        first = jnp.clip((jnp.min(q_pos) - window + 1) // c, 0, n)
    return jax.lax.fori_loop(first, n, body, init)


class Attention(nnx.Module):
    """Grouped-query attention over committed cache slots plus the current block."""

    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs, layer: int = 0):
        self.cfg = cfg
        self.window = cfg.layer_window(layer)  # 0: global
        self.theta, self.scaling = cfg.layer_rope(layer)
        d, h, kv, hd = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        pd = cfg.param_dtype
        out_scale = 1.0 / (2 * cfg.n_layers)  # residual branches start small
        std_in = _fan_in_std(d)
        emb = ((d, 'embed'),)
        if cfg.fused_projections:  # per KV head: its G query heads, then its key, its value
            g = h // kv
            self.wqkv = _weight(
                rngs,
                cfg,
                emb,
                ((kv, 'kv_heads'), (g + 2, None), (hd, 'head_dim')),
                std_in,
                pd,
            )
        else:
            heads = ((h, 'heads'), (hd, 'head_dim'))
            kv_heads = ((kv, 'kv_heads'), (hd, 'head_dim'))
            self.wq = _weight(rngs, cfg, emb, heads, std_in, pd)
            self.wk = _weight(rngs, cfg, emb, kv_heads, std_in, pd)
            self.wv = _weight(rngs, cfg, emb, kv_heads, std_in, pd)
        self.wo = _weight(
            rngs,
            cfg,
            ((h, 'heads'), (hd, 'head_dim')),
            emb,
            _fan_in_std(h * hd, out_scale),
            pd,
        )
        if cfg.qkv_bias and cfg.fused_projections:  # zero-initialised (init_std 0)
            self.bqkv = _param(rngs, (kv, h // kv + 2, hd), ('kv_heads', None, 'head_dim'), 0.0, pd)
        elif cfg.qkv_bias:
            self.bq = _param(rngs, (h, hd), ('heads', 'head_dim'), 0.0, pd)
            self.bk = _param(rngs, (kv, hd), ('kv_heads', 'head_dim'), 0.0, pd)
            self.bv = _param(rngs, (kv, hd), ('kv_heads', 'head_dim'), 0.0, pd)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(hd, cfg, rngs=rngs, axis='head_dim')
            self.k_norm = RMSNorm(hd, cfg, rngs=rngs, axis='head_dim')

    def __call__(self, x, positions, block_mask, cache=None):
        """Args:
          x: [B, T, D]; positions: i32[B, T]; block_mask: bool[B, T, T].
          cache: None (no history) or (k, v, length): this layer's keys [B, KV, hd, S]
            and values [B, KV, S, hd] (``specjax.models.cache``) and i32[B] committed slots.

        Returns (out [B, T, D], this layer's updated (k, v) arrays or None).
        """
        cfg = self.cfg
        dt = jnp.dtype(cfg.dtype)
        B, T, _ = x.shape
        kv, g, hd = cfg.n_kv_heads, cfg.n_heads // cfg.n_kv_heads, cfg.head_dim
        q, k, v = self._qkv(x, positions, dt)
        qg = q.reshape(B, T, kv, g, hd)

        # The block attends to its own keys directly, so its logits never depend on where
        # (or whether) it lands in the cache; the cache supplies only committed slots.
        s_blk = jnp.einsum('btkgh,bskh->bkgts', qg, k, preferred_element_type=accumulation(dt))
        if self.window:  # a local layer: block keys within the window of each query
            near = positions[:, :, None] - positions[:, None, :] < self.window
            block_mask = block_mask & near
        s_blk = jnp.where(block_mask[:, None, None, :, :], s_blk, _NEG)
        if cache is None:
            probs = jax.nn.softmax(s_blk, axis=-1).astype(dt)
            out = jnp.einsum('bkgts,bskh->bkgth', probs, v)  # [B, KV, G, T, hd]
            new_cache = None
        else:
            out, new_cache = self._with_cache(qg, k, v, s_blk, positions, cache, dt)
        # The output projection: the heads' outputs ([B, KV, G, T, hd], as the attention
        # made them) transposed to [B, T, H·hd] and contracted with wo as stored ([H·hd,
        # D]). The barrier pins that (small) transpose on the activation: without it XLA
        # folded the transpose into the dot and transposed wo instead, a copy of the
        # weight on every call (4 per verifier forward, ~10% of a one-token step on CPU).
        out = out.transpose(0, 3, 1, 2, 4).reshape(B, T, cfg.n_heads * hd)
        out = jax.lax.optimization_barrier(out)
        of = cfg.out_first
        wo = self.wo[...].astype(dt)
        wo = wo.reshape(-1, cfg.n_heads * hd) if of else wo.reshape(cfg.n_heads * hd, -1)
        y = project(out, wo, dt, out_first=of)
        return y, new_cache

    def _qkv(self, x, positions, dt):
        """The block's queries ``[B, T, H, hd]`` (scaled, rotated) and keys and values
        ``[B, T, KV, hd]`` (keys rotated): the projections, their biases and norms."""
        cfg = self.cfg
        B, T, _ = x.shape
        g, hd = cfg.n_heads // cfg.n_kv_heads, cfg.head_dim
        of = cfg.out_first
        if cfg.fused_projections:  # one product reads the three weights
            qkv = project(x, self.wqkv[...], dt, out_first=of)
            if cfg.qkv_bias:
                qkv = qkv + self.bqkv[...].astype(dt)
            q = qkv[:, :, :, :g].reshape(B, T, cfg.n_heads, hd)  # head k·G + j, as qg reads
            k, v = qkv[:, :, :, g], qkv[:, :, :, g + 1]
        else:
            q = project(x, self.wq[...], dt, out_first=of)
            k = project(x, self.wk[...], dt, out_first=of)
            v = project(x, self.wv[...], dt, out_first=of)
            if cfg.qkv_bias:
                q, k, v = (
                    y + b[...].astype(dt) for y, b in ((q, self.bq), (k, self.bk), (v, self.bv))
                )
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q = with_logical_constraint(q, ('batch', 'length', 'heads', 'head_dim'))
        q_scale = (cfg.query_pre_attn_scalar or hd) ** -0.5
        q = rotary(q, positions, self.theta, self.scaling) * jnp.asarray(q_scale, dt)
        k = rotary(k, positions, self.theta, self.scaling)
        return q, k, v

    def _with_cache(self, qg, k, v, s_blk, positions, cache, dt):
        """The block's attention over the cache's committed slots and its own keys (one
        softmax), and the cache with the block written: ``(out [B, KV, G, T, hd], (k, v))``."""
        B, T, kv, g, hd = qg.shape
        cache_k, cache_v, length = cache
        kt, vt = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [B, KV, T, hd]
        # Write first, then read the *updated* arrays: the old buffers die at the
        # write, so XLA updates the cache in place instead of copying it every step.
        cache_k = write_keys(cache_k, kt, length)
        cache_v = write_block(cache_v, vt, length)
        # Query rows (g, t) of each KV head against its slots: batch dims (B, KV)
        # leading, as the cache is laid out (keys [hd, S], values [S, hd]: no repacks).
        qc = qg.transpose(0, 2, 3, 1, 4).reshape(B, kv, g * T, hd)
        window = {}
        if self.window:  # query row g·T + t is at positions[:, t]
            window = dict(q_pos=jnp.tile(positions, (1, g)), window=self.window)
        m_c, z_c, o_c = cache_attention(qc, cache_k, cache_v, length, dt, **window)
        m_c, z_c = m_c.reshape(B, kv, g, T), z_c.reshape(B, kv, g, T)
        # Softmax over [committed slots, block tokens] without concatenating them: the
        # cache's (max, sum, unnormalised output) merged with the block's, normalised
        # on the (smaller) outputs.
        m = jnp.maximum(m_c, jnp.max(s_blk, axis=-1))  # [B, KV, G, T]
        e_b = jnp.exp(s_blk - m[..., None])
        scale_c = jnp.exp(m_c - m)
        z = z_c * scale_c + jnp.sum(e_b, axis=-1)
        o_b = jnp.einsum(
            'bkgts,bksh->bkgth', e_b.astype(dt), vt, preferred_element_type=accumulation(dt)
        )
        out = ((o_c.reshape(B, kv, g, T, hd) * scale_c[..., None] + o_b) / z[..., None]).astype(dt)
        return out, (cache_k, cache_v)


class MLP(nnx.Module):
    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        self.dtype = cfg.dtype
        self.act = cfg.mlp_act
        self.fused = cfg.fused_projections
        self.out_first = cfg.out_first
        d, f, pd = cfg.d_model, cfg.d_ff, cfg.param_dtype
        emb, mlp = ((d, 'embed'),), ((f, 'mlp'),)
        if self.fused:
            self.w_gate_up = _weight(rngs, cfg, emb, ((2, None),) + mlp, _fan_in_std(d), pd)
        else:
            self.w_gate = _weight(rngs, cfg, emb, mlp, _fan_in_std(d), pd)
            self.w_up = _weight(rngs, cfg, emb, mlp, _fan_in_std(d), pd)
        self.w_down = _weight(rngs, cfg, mlp, emb, _fan_in_std(f, 1.0 / (2 * cfg.n_layers)), pd)

    def __call__(self, x):
        dt = jnp.dtype(self.dtype)
        of = self.out_first
        if self.fused:  # one product reads both weights
            gu = project(x, self.w_gate_up[...], dt, out_first=of)
            gate, up = gu[:, :, 0], gu[:, :, 1]
        else:
            gate = project(x, self.w_gate[...], dt, out_first=of)
            up = project(x, self.w_up[...], dt, out_first=of)
        h = with_logical_constraint(_ACTS[self.act](gate) * up, ('batch', 'length', 'mlp'))
        return project(h, self.w_down[...], dt, out_first=of)


class Block(nnx.Module):
    """Pre-norm attention and MLP (``layer``: its index, which picks its window and
    rotary base); with `TransformerConfig.post_norms` each branch's output is normed too
    before it joins the residual stream (Gemma's four norms)."""

    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs, layer: int = 0):
        self.attn_norm = RMSNorm(cfg.d_model, cfg, rngs=rngs)
        self.attn = Attention(cfg, rngs=rngs, layer=layer)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg, rngs=rngs)
        self.mlp = MLP(cfg, rngs=rngs)
        self.post_norms = cfg.post_norms
        if cfg.post_norms:
            self.attn_post_norm = RMSNorm(cfg.d_model, cfg, rngs=rngs)
            self.mlp_post_norm = RMSNorm(cfg.d_model, cfg, rngs=rngs)

    def __call__(self, x, positions, block_mask, cache=None):
        a, new_cache = self.attn(self.attn_norm(x), positions, block_mask, cache)
        if self.post_norms:
            a = self.attn_post_norm(a)
        x = x + a
        m = self.mlp(self.mlp_norm(x))
        if self.post_norms:
            m = self.mlp_post_norm(m)
        x = x + m
        return with_logical_constraint(x, ('batch', 'length', 'embed')), new_cache


class Transformer(nnx.Module):
    """Token ids -> next-token logits. Layers are attributes ``layer_{i}`` so the pure
    parameter dict has string keys only (orbax- and npz-friendly)."""

    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        # Untied: unit-variance rows (the first RMSNorm fixes the scale). Tied (Gemma-style):
        # rows of norm ~1 so the output logits start O(1); inputs are rescaled by sqrt(d).
        std = cfg.d_model**-0.5 if cfg.tie_embeddings else 1.0
        self.embed = _param(
            rngs, (cfg.vocab_size, cfg.d_model), ('vocab', 'embed'), std, cfg.param_dtype
        )
        for i in range(cfg.n_layers):
            setattr(self, f'layer_{i}', Block(cfg, rngs=rngs, layer=i))
        self.final_norm = RMSNorm(cfg.d_model, cfg, rngs=rngs)
        if not cfg.tie_embeddings:
            self.lm_head = _weight(
                rngs,
                cfg,
                ((cfg.d_model, 'embed'),),
                ((cfg.vocab_size, 'vocab'),),
                _fan_in_std(cfg.d_model),
                cfg.param_dtype,
            )

    def __call__(
        self,
        tokens,
        positions,
        block_mask,
        cache_k=None,
        cache_v=None,
        length=None,
        with_hidden=False,
        logits_at=None,
        hidden_layers=None,
    ):
        """Args:
          tokens, positions: i32[B, T]; block_mask: bool[B, T, T].
          cache_k, cache_v: per-layer keys [B, KV, hd, S] and values [B, KV, S, hd]
            (``PerLayer``) or None;
            length: i32[B].

        Returns (logits f32[B, T, V], cache_k, cache_v) with the block's keys/values
        written at slots [length, length + T) (None, None without a cache); with
        ``with_hidden`` a fourth item, the final-normed hidden states [B, T, D] the head
        reads (the features a feature drafter, `specjax.models.eagle`, drafts from).
        ``logits_at`` (i32[B, R] block positions, or None for all T): the head runs on those
        rows only and the logits are f32[B, R, V] (a prefill reads one row per prompt).
        ``hidden_layers`` (with ``with_hidden``; a tuple of ints in [0, n_layers]): the
        fourth item is instead those states concatenated, [B, T, n·D] — index i < n_layers
        the residual stream after block i, n_layers the final-normed state (EAGLE-3's
        low/mid/high features, `specjax.models.eagle`).
        """
        cfg = self.cfg
        dt = jnp.dtype(cfg.dtype)
        table = self.embed[...]
        x = half_take(table, tokens, axis=0, dtype=cfg.param_dtype).astype(dt)
        if table.dtype == jnp.uint16:  # stored as bits (`cache.table_bits`)
            table = table_values(table, cfg.param_dtype)
        if cfg.tie_embeddings and cfg.embed_input_scale:
            x = x * jnp.asarray(cfg.d_model**0.5, dt)
        x = with_logical_constraint(x, ('batch', 'length', 'embed'))
        new_k, new_v = [], []
        taken = {}
        for i in range(cfg.n_layers):
            layer = getattr(self, f'layer_{i}')
            cache = None if cache_k is None else (cache_k[i], cache_v[i], length)
            x, new_cache = layer(x, positions, block_mask, cache)
            if new_cache is not None:
                new_k.append(new_cache[0])
                new_v.append(new_cache[1])
            if hidden_layers is not None and i in hidden_layers:
                taken[i] = x
        if cache_k is not None:
            cache_k, cache_v = PerLayer(new_k), PerLayer(new_v)
        x = self.final_norm(x)
        if cfg.tie_embeddings:  # the table is [V, D]: out first already
            head, of = (table, True) if cfg.out_first else (table.T, False)
        else:
            head, of = self.lm_head[...], cfg.out_first
        xh = x if logits_at is None else block_rows(x, logits_at)
        acc = accumulation(dt)  # logits f32 (f64 in an f64 exactness check)
        logits = project(xh, head, dt, out_dtype=acc, out_first=of)
        logits = with_logical_constraint(logits.astype(acc), ('batch', 'length', 'vocab'))
        if with_hidden:
            if hidden_layers is not None:
                taken[cfg.n_layers] = x
                x = jnp.concatenate([taken[i] for i in hidden_layers], axis=-1)
            return logits, cache_k, cache_v, x
        return logits, cache_k, cache_v
