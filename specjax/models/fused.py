"""Parameter layouts of the transformer, and converting between them; the same function in
every layout.

* The fused projection layout (`TransformerConfig.fused_projections`): separate q/k/v and
  gate/up tables or fused ones.
* The weight order (`TransformerConfig.out_first`): projection weights stored ``[*in,
  *out]`` (the default) or ``[*out, *in]``, as HF and GGUF keep them.

`separate_leaf` reads any layout's leaf back as the default layout holds it (HF export)."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from specjax.models.cache import table_values
from specjax.models.transformer import TransformerConfig

#: Separate-layout leaves and the fused leaf that holds them, per block.
_FUSED_LEAVES = {
    ('attn', 'wq'): ('attn', 'wqkv'),
    ('attn', 'wk'): ('attn', 'wqkv'),
    ('attn', 'wv'): ('attn', 'wqkv'),
    ('attn', 'bq'): ('attn', 'bqkv'),
    ('attn', 'bk'): ('attn', 'bqkv'),
    ('attn', 'bv'): ('attn', 'bqkv'),
    ('mlp', 'w_gate'): ('mlp', 'w_gate_up'),
    ('mlp', 'w_up'): ('mlp', 'w_gate_up'),
}


#: Projection leaves of a block and their input dims in the ``[*in, *out]`` order.
_N_IN = {
    ('attn', 'wq'): 1,
    ('attn', 'wk'): 1,
    ('attn', 'wv'): 1,
    ('attn', 'wqkv'): 1,
    ('attn', 'wo'): 2,
    ('mlp', 'w_gate'): 1,
    ('mlp', 'w_up'): 1,
    ('mlp', 'w_gate_up'): 1,
    ('mlp', 'w_down'): 1,
}


def _n_in(path: tuple) -> int:
    """Input dims of the projection weight at ``path`` (0: not a projection weight)."""
    if tuple(path) == ('lm_head',):
        return 1
    return _N_IN.get(tuple(path[1:]), 0) if len(path) == 3 else 0


def _flip(x, n_in: int, out_first: bool):
    """``[*in, *out]`` -> ``[*out, *in]`` (``out_first``), or back (``n_in`` input dims)."""
    n_lead = n_in if out_first else x.ndim - n_in
    return jnp.transpose(x, tuple(range(n_lead, x.ndim)) + tuple(range(n_lead)))


def order_params(cfg: TransformerConfig, params: dict, out_first: bool, place=None) -> dict:
    """Parameters of ``cfg`` in the weight order of ``dataclasses.replace(cfg,
    out_first=out_first)``: every projection weight (q/k/v/o, gate/up/down, their fused
    tables, an untied head) transposed between ``[*in, *out]`` and ``[*out, *in]``;
    norms, biases and the embedding table unchanged.

    Each output element is the same dot product over the same terms either way: only the
    product's form changes (`specjax.models.products.project`). ``place``: as in
    `fuse_params`; a block's old leaves are dropped as its new ones are made.
    """
    if bool(cfg.out_first) == bool(out_first):
        raise ValueError(
            f'order_params: cfg.out_first={cfg.out_first} already (allowed: {not out_first})'
        )
    place = place or (lambda path, x: x)
    out = dict(params)
    for i in range(cfg.n_layers):
        name = f'layer_{i}'
        block = {k: dict(v) if isinstance(v, dict) else v for k, v in out[name].items()}
        for (mod, leaf), n_in in _N_IN.items():
            if leaf in block.get(mod, {}):
                block[mod][leaf] = place(
                    (name, mod, leaf), _flip(block[mod][leaf], n_in, out_first)
                )
        out[name] = block
    if 'lm_head' in out:
        out['lm_head'] = place(('lm_head',), _flip(out['lm_head'], 1, out_first))
    return out


def fuse_params(cfg: TransformerConfig, params: dict, place=None) -> dict:
    """Parameters of ``cfg`` (separate q/k/v and gate/up) in the fused layout of
    ``dataclasses.replace(cfg, fused_projections=True)``.

    A decode step on a memory-bound machine reads every weight once either way; fused, a
    block makes 4 matrix products instead of 7 (on the 2-core CPU of docs/performance.md's
    run real_speed, one product per weight read costs a fixed overhead that fusing saves).
    Head order is kept: query head ``k·G + j`` is ``wqkv[:, k, j]``, KV head k's key and
    value ``wqkv[:, k, G]`` and ``wqkv[:, k, G + 1]``; ``w_gate_up[:, 0]`` is the gate.

    Args:
      cfg: the separate layout's config (``fused_projections=False``).
      params: its parameters (nested dicts, ``layer_{i}`` blocks).
      place: optional ``place(path, array) -> array`` for each new leaf (e.g. a
        ``jax.device_put`` to its sharding); the separate leaves are dropped layer by
        layer, so at most one block is held twice.
    """
    if cfg.fused_projections:
        raise ValueError('fuse_params: cfg.fused_projections=True already (allowed: False)')
    if cfg.out_first:  # fuse in the [*in, *out] order, then store the result out first
        in_first = dataclasses.replace(cfg, out_first=False)
        fused = fuse_params(in_first, order_params(cfg, params, False))
        return order_params(
            dataclasses.replace(in_first, fused_projections=True), fused, True, place
        )
    kv, g, hd, d = cfg.n_kv_heads, cfg.n_heads // cfg.n_kv_heads, cfg.head_dim, cfg.d_model
    place = place or (lambda path, x: x)
    out = dict(params)
    for i in range(cfg.n_layers):
        name = f'layer_{i}'
        block = {k: dict(v) if isinstance(v, dict) else v for k, v in out[name].items()}
        a, m = block['attn'], block['mlp']
        wq, wk, wv = a.pop('wq'), a.pop('wk'), a.pop('wv')
        a['wqkv'] = place(
            (name, 'attn', 'wqkv'),
            jnp.concatenate(
                [jnp.reshape(wq, (d, kv, g, hd)), wk[:, :, None], wv[:, :, None]], axis=2
            ),
        )
        if cfg.qkv_bias:
            bq, bk, bv = a.pop('bq'), a.pop('bk'), a.pop('bv')
            a['bqkv'] = place(
                (name, 'attn', 'bqkv'),
                jnp.concatenate([jnp.reshape(bq, (kv, g, hd)), bk[:, None], bv[:, None]], 1),
            )
        m['w_gate_up'] = place(
            (name, 'mlp', 'w_gate_up'), jnp.stack([m.pop('w_gate'), m.pop('w_up')], axis=1)
        )
        out[name] = block
        del wq, wk, wv
    return out


def separate_leaf(cfg: TransformerConfig, params: dict, path: tuple):
    """The default layout's leaf at ``path`` (e.g. ``('layer_3', 'attn', 'wk')``: separate,
    ``[*in, *out]``) read from ``params`` in ``cfg``'s layout (a slice of the fused leaf
    where ``cfg`` is fused, transposed back where ``cfg.out_first``)."""
    key = tuple(path[1:]) if len(path) == 3 else None
    fused_leaf = cfg.fused_projections and key in _FUSED_LEAVES
    stored = (path[0],) + _FUSED_LEAVES[key] if fused_leaf else tuple(path)
    node = params
    for p in stored:
        node = node[p]
    if tuple(path) == ('embed',):  # possibly stored as bits (`cache.table_bits`)
        node = table_values(node, cfg.param_dtype)
    if cfg.out_first and _n_in(stored):
        node = _flip(node, _n_in(stored), False)
    if not fused_leaf:
        return node
    kv, g, hd = cfg.n_kv_heads, cfg.n_heads // cfg.n_kv_heads, cfg.head_dim
    fused = node
    part = key[1]
    if part == 'wq':
        return fused[:, :, :g].reshape(fused.shape[0], kv * g, hd)
    if part in ('wk', 'wv'):
        return fused[:, :, g if part == 'wk' else g + 1]
    if part == 'bq':
        return fused[:, :g].reshape(kv * g, hd)
    if part in ('bk', 'bv'):
        return fused[:, g if part == 'bk' else g + 1]
    return fused[:, 0 if part == 'w_gate' else 1]


def unfuse_params(cfg: TransformerConfig, params: dict) -> dict:
    """The inverse of `fuse_params`: ``cfg`` is the fused config; returns the separate
    layout's parameters."""
    if not cfg.fused_projections:
        raise ValueError('unfuse_params: cfg.fused_projections=False (allowed: True)')
    out = dict(params)
    for i in range(cfg.n_layers):
        name = f'layer_{i}'
        block = {k: dict(v) if isinstance(v, dict) else v for k, v in out[name].items()}
        for (mod, leaf), (_, fused) in _FUSED_LEAVES.items():
            if fused in params[name][mod]:
                x = separate_leaf(cfg, params, (name, mod, leaf))  # [*in, *out]
                n_in = _N_IN.get((mod, leaf), 0)
                block[mod][leaf] = _flip(x, n_in, True) if cfg.out_first and n_in else x
        block['attn'].pop('wqkv', None)
        block['attn'].pop('bqkv', None)
        block['mlp'].pop('w_gate_up', None)
        out[name] = block
    return out
