"""The weight products of `specjax.models.transformer`, in the form XLA:CPU's kernels take.

Every projection of the model (q/k/v, the output, gate/up/down, the head) is one call of
`project`; `PRODUCTS` and `HALF_MIN_ROWS` are read at trace time (paired comparisons set
them: `experiments/compare_layouts.py`'s ``einsum`` token).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ['HALF_MIN_ROWS', 'PRODUCTS', 'project']

PRODUCTS = 'flat'  # weight products: 'flat' (`project`) or 'einsum' (before it); trace time
HALF_MIN_ROWS = 2  # a half-precision product of fewer rows is padded to this many (any platform)


def project(x: jax.Array, w: jax.Array, dt, out_dtype=None, out_first: bool = False) -> jax.Array:
    """A weight product: ``x: [B, T, *in]`` contracted over its trailing dims with the
    leading dims of ``w: [*in, *out]`` (``out_first``: the trailing dims of ``w: [*out,
    *in]``, `TransformerConfig.out_first`), giving ``[B, T, *out]`` in ``out_dtype``
    (default the compute dtype ``dt``).

    It runs as one 2-D product ``[B·T, K] × [K, N]``; in half precision the operands are
    ``dt`` and the product accumulates in f32 (``preferred_element_type``), rounded once
    to the output dtype. On XLA:CPU that is the form its YNNPACK kernels take for bf16,
    and they take it only from two rows up (one row takes another path, several times
    slower than f32), so a one-row half-precision product (``B = T = 1``: a decode
    step at batch 1) is padded with a zero row, dropped after (no value depends on it).
    Measured on the 2-core Xeon with AVX-512 BF16 (docs/performance.md, run products): SmolLM2 in
    bf16, one-token step 42.3 -> 36.2 ms and T_score(9) / T_step 1.44 -> 1.01 at batch 1
    with the f32 accumulation and the pad; f32 is unchanged by them. The pad is kept on
    every platform: on a TPU a one-row product with f32 accumulation is rewritten by XLA
    into an f32 multiply-and-reduce that first writes an f32 copy of the weight (XLA:TPU,
    libtpu 0.0.42: the attention weights of Llama-3.1-70B's decode step converted per call,
    74.1 GB accessed per chip on a v5p-8 against 48.5 GB at two rows and a step estimated
    at 31.5 against 20.6 ms); padded, the product stays on the matrix unit, which pads rows
    to its tile anyway. `PRODUCTS = 'einsum'` traces the products as before (an einsum
    in ``dt``), for paired comparisons.

    ``out_first`` makes the product ``[B·T, K] × [N, K]ᵀ`` (contracting both last dims;
    no transpose is materialised). On the same Xeon, bf16 with f32 accumulation, SmolLM2's
    30 layers of products took 15 ms stored ``[out, in]`` against 21 ms ``[in, out]`` at
    2-10 rows, and its head 2.0 against 3.0 ms at 10 rows (docs/performance.md).
    """
    dt = jnp.dtype(dt)
    out_dtype = dt if out_dtype is None else jnp.dtype(out_dtype)
    n_in = x.ndim - 2
    n_out = w.ndim - n_in
    if PRODUCTS == 'einsum':
        letters = 'abcdefgh'
        ins, outs = letters[:n_in], letters[n_in : w.ndim]
        ws = f'{outs}{ins}' if out_first else f'{ins}{outs}'
        spec = f'yz{ins},{ws}->yz{outs}'
        y = jnp.einsum(spec, x.astype(dt), w.astype(dt), preferred_element_type=out_dtype)
        return y.astype(out_dtype)
    B, T = x.shape[:2]
    rows = B * T
    out_shape = w.shape[:n_out] if out_first else w.shape[n_in:]
    x2 = x.reshape(rows, -1).astype(dt)
    k = x2.shape[1]
    w2 = (w.reshape(-1, k) if out_first else w.reshape(k, -1)).astype(dt)
    half = dt.itemsize == 2
    if half and rows < HALF_MIN_ROWS:
        x2 = jnp.pad(x2, ((0, HALF_MIN_ROWS - rows), (0, 0)))
    acc = jnp.float32 if half else out_dtype
    if out_first:
        y = jax.lax.dot_general(x2, w2, (((1,), (1,)), ((), ())), preferred_element_type=acc)
    else:
        y = jnp.dot(x2, w2, preferred_element_type=acc)
    return y[:rows].reshape(B, T, *out_shape).astype(out_dtype)
