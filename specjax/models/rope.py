"""Rotary position embeddings: the (hashable) scaling spec of a `TransformerConfig`,
the inverse frequencies with HF's 'linear' / 'llama3' scaling, and the rotation itself
(rotate-half convention, explicit position ids)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

_ROPE_TYPES = {
    'linear': ('factor',),
    'llama3': ('factor', 'low_freq_factor', 'high_freq_factor', 'original_max_position_embeddings'),
}


def parse_rope_scaling(value) -> tuple:
    """A dict / list of pairs / tuple -> sorted ``((key, value), ...)`` (hashable)."""
    if value in (None, (), [], {}):
        return ()
    try:
        items = dict(value.items() if hasattr(value, 'items') else value)
    except (TypeError, ValueError):
        raise ValueError(
            f'TransformerConfig.rope_scaling={value!r}: must be a mapping or (key, value) pairs'
        ) from None
    kind = items.get('rope_type', items.get('type'))
    items.pop('type', None)
    items['rope_type'] = kind
    if kind not in _ROPE_TYPES:
        raise ValueError(
            f'TransformerConfig.rope_scaling: rope_type={kind!r} is not supported '
            f'(allowed: {sorted(_ROPE_TYPES)})'
        )
    missing = [k for k in _ROPE_TYPES[kind] if not isinstance(items.get(k), (int, float))]
    if missing:
        raise ValueError(
            f'TransformerConfig.rope_scaling: rope_type={kind!r} needs numbers for {missing}'
        )
    keep = ('rope_type',) + _ROPE_TYPES[kind]
    return tuple(sorted((k, items[k] if k == 'rope_type' else float(items[k])) for k in keep))


def rope_inv_freq(head_dim: int, theta: float, scaling: tuple = ()) -> np.ndarray:
    """f32[head_dim // 2] rotary inverse frequencies, with HF's 'linear' / 'llama3' scaling."""
    half = head_dim // 2
    # The f32 table transformers computes: 1 / f32(theta ** f32(i / half)). Its f32 power
    # is accurate to the last bit, NumPy's f32 power is not (it differed in the last bit
    # at 5 of SmolLM2's 32 frequencies), so the power is taken in f64 and rounded.
    exponent = (np.arange(half, dtype=np.float32) / np.float32(half)).astype(np.float64)
    inv = np.float32(1.0) / (np.float64(theta) ** exponent).astype(np.float32)
    s = dict(scaling)
    if s.get('rope_type') == 'linear':
        inv = inv / np.float32(s['factor'])
    elif s.get('rope_type') == 'llama3':
        # Long wavelengths are divided by `factor`, short ones kept, the band between
        # interpolated (transformers' _compute_llama3_parameters).
        factor, lo, hi, old = (
            float(s[k])
            for k in (
                'factor',
                'low_freq_factor',
                'high_freq_factor',
                'original_max_position_embeddings',
            )
        )
        wavelen = 2 * np.pi / inv
        smooth = (old / wavelen - lo) / (hi - lo)
        scaled = np.where(wavelen > old / lo, inv / factor, inv)
        mid = (wavelen <= old / lo) & (wavelen >= old / hi)
        inv = np.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled)
    return inv.astype(np.float32)


def rotary(x: jax.Array, positions: jax.Array, theta: float, scaling: tuple = ()) -> jax.Array:
    """Rotates ``x: [B, T, N, hd]`` by ``positions: i32[B, T]`` (rotate-half convention)."""
    inv_freq = rope_inv_freq(x.shape[-1], theta, scaling)
    # f32 angles, sin and cos (f64 in an f64 model: an exactness check's reference).
    acc = jnp.promote_types(x.dtype, jnp.float32)
    angles = positions.astype(acc)[..., None] * inv_freq.astype(acc)  # [B, T, half]
    sin = jnp.sin(angles)[:, :, None, :]
    cos = jnp.cos(angles)[:, :, None, :]
    x1, x2 = jnp.split(x.astype(acc), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)
