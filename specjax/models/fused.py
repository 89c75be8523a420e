"""The fused projection layout (`TransformerConfig.fused_projections`): converting a model's
parameters between separate q/k/v and gate/up tables and the fused ones, and reading a
separate leaf back from the fused tables (HF export). The same function either way."""

from __future__ import annotations

import jax.numpy as jnp

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


def fuse_params(cfg: TransformerConfig, params: dict, place=None) -> dict:
    """Parameters of ``cfg`` (separate q/k/v and gate/up) in the fused layout of
    ``dataclasses.replace(cfg, fused_projections=True)``.

    A decode step on a memory-bound machine reads every weight once either way; fused, a
    block makes 4 matrix products instead of 7 (on the 2-core CPU of docs/results/
    real_speed.md, one product per weight read costs a fixed overhead that fusing saves).
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
    """The separate layout's leaf at ``path`` (e.g. ``('layer_3', 'attn', 'wk')``) read
    from ``params`` in ``cfg``'s layout (a slice of the fused leaf where ``cfg`` is fused)."""
    node = params
    key = tuple(path[1:]) if len(path) == 3 else None
    if not cfg.fused_projections or key not in _FUSED_LEAVES:
        for p in path:
            node = node[p]
        return node
    kv, g, hd = cfg.n_kv_heads, cfg.n_heads // cfg.n_kv_heads, cfg.head_dim
    fused = params[path[0]][_FUSED_LEAVES[key][0]][_FUSED_LEAVES[key][1]]
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
                block[mod][leaf] = separate_leaf(cfg, params, (name, mod, leaf))
        block['attn'].pop('wqkv', None)
        block['attn'].pop('bqkv', None)
        block['mlp'].pop('w_gate_up', None)
        out[name] = block
    return out
