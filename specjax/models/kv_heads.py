"""Key/value heads repeated so that a tensor-parallel mesh axis divides them.

Under tensor parallelism the query heads are split over the 'model' axis. When that axis
has more shards than the model has KV heads (Llama-3.1-70B: 8 KV heads on a 16-chip
slice), the K/V projections and the cache cannot be split by head, and left replicated
the compiler gathers every layer's keys and values each step. The standard cure (as
serving stacks do) is to repeat each KV head ``r`` times, so every shard holds the
KV heads its own query heads read: `repeat_kv_heads` returns the same function with
``n_kv_heads · r`` heads, each query head reading a copy of the very head it read before.
The cache grows ``r``-fold (per shard it is what that shard needs); the logits are
identical.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

__all__ = ['kv_repeat_for', 'repeat_kv_heads', 'serve_form']


def kv_repeat_for(cfg, shards: int) -> int:
    """The smallest ``r`` with ``n_kv_heads · r`` divisible by ``shards`` and dividing
    ``n_heads`` (1 when the KV heads already divide, or when no such ``r`` exists)."""
    kv, h = cfg.n_kv_heads, cfg.n_heads
    if shards <= 1 or kv % shards == 0:
        return 1
    r = math.lcm(kv, shards) // kv
    return r if h % (kv * r) == 0 else 1


def _is_abstract(params) -> bool:
    return any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(params))


def repeat_kv_heads(lm, params, r: int):
    """``(lm', params')``: ``lm`` with each KV head repeated ``r`` times (``r`` divides
    the query heads per KV head). ``params`` may be abstract (``ShapeDtypeStruct``)."""
    # Imported here: specjax.models.api imports this module's siblings, not the reverse.
    from specjax.models.api import TransformerLM  # pylint: disable=import-outside-toplevel

    cfg = lm.config
    g = cfg.n_heads // cfg.n_kv_heads
    if r == 1:
        return lm, params
    if r < 1 or g % r:
        raise ValueError(
            f'repeat_kv_heads: r={r}; allowed: a divisor of the {g} query heads per KV head'
        )
    new_lm = TransformerLM(dataclasses.replace(cfg, n_kv_heads=cfg.n_kv_heads * r))
    if _is_abstract(params):
        return new_lm, new_lm.abstract_params()
    of = cfg.out_first

    def kv_axis(w, trailing: int):
        # [D, KV, ...] stored in-first; [KV, ..., D] out-first (the KV axis leads the out dims)
        return 0 if of else w.ndim - trailing

    def rep(w, trailing):
        return jnp.repeat(w, r, axis=kv_axis(w, trailing))

    def fused(w, is_bias=False):
        # [.., KV, G+2, hd ..]: per KV head its G query heads, its key, its value
        ax = 0 if (of or is_bias) else w.ndim - 3
        kv = w.shape[ax]
        q = jax.lax.slice_in_dim(w, 0, g, axis=ax + 1)
        k = jax.lax.slice_in_dim(w, g, g + 1, axis=ax + 1)
        v = jax.lax.slice_in_dim(w, g + 1, g + 2, axis=ax + 1)
        q = q.reshape(w.shape[: ax + 1] + (r, g // r) + w.shape[ax + 2 :])
        k, v = (jnp.expand_dims(x, ax + 1) for x in (k, v))
        k, v = (jnp.broadcast_to(x, x.shape[: ax + 1] + (r,) + x.shape[ax + 2 :]) for x in (k, v))
        out = jnp.concatenate([q, k, v], axis=ax + 2)
        return out.reshape(w.shape[:ax] + (kv * r, g // r + 2) + w.shape[ax + 2 :])

    out = dict(params)
    for i in range(cfg.n_layers):
        layer = dict(out[f'layer_{i}'])
        attn = dict(layer['attn'])
        if cfg.fused_projections:
            attn['wqkv'] = fused(attn['wqkv'])
            if 'bqkv' in attn:
                attn['bqkv'] = fused(attn['bqkv'], is_bias=True)
        else:
            for name in ('wk', 'wv'):
                attn[name] = rep(attn[name], 2)  # [D, KV, hd] / [KV, hd, D]
            for name in ('bk', 'bv'):
                if name in attn:
                    attn[name] = jnp.repeat(attn[name], r, axis=0)  # [KV, hd]
        layer['attn'] = attn
        out[f'layer_{i}'] = layer
    return new_lm, out


def serve_form(lm, params, model_shards: int, untie_head: bool = True):
    """``(lm', params')``: the same function in the form a mesh with ``model_shards``
    shards on 'model' serves it (a `TransformerLM`; any other model is returned as is).

    - KV heads repeated until the model axis divides them (`repeat_kv_heads`): each shard
      holds the KV heads its query heads read, nothing is gathered per step.
    - With ``untie_head``, a tied head (without Gemma's input scaling) stored as its own
      ``[D, V]`` array: the TPU compiler lays a tied table out for its row gather and relaid
      it (a copy of the whole table, 54 MiB for SmolLM2) on every call scoring more than one
      row. Costs the table's bytes once more in memory.
    """
    # Imported here: specjax.models.api imports this module's siblings, not the reverse.
    from specjax.models.api import TransformerLM  # pylint: disable=import-outside-toplevel

    if not isinstance(lm, TransformerLM):
        return lm, params
    lm, params = repeat_kv_heads(lm, params, kv_repeat_for(lm.config, model_shards))
    cfg = lm.config
    if untie_head and cfg.tie_embeddings and not cfg.embed_input_scale:
        untied = TransformerLM(dataclasses.replace(cfg, tie_embeddings=False))
        if _is_abstract(params):
            return untied, untied.abstract_params()
        table = params['embed']
        head = table if cfg.out_first else table.T
        return untied, dict(params, lm_head=head)
    return lm, params
